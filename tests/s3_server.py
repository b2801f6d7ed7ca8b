"""A real S3-compatible server on loopback for the tests: moto's server mode.

``S3Server`` starts moto's threaded server (the S3 HTTP API, werkzeug underneath) on
127.0.0.1 with a port the system picks, and ``bucket(name)`` creates a bucket on it and
returns a ``BucketConfig`` pointing at it. Credentials: moto accepts any; the tests put
dummy ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` in the environment (``AWS_ENV``),
which is also how a broker subprocess gets them — the default chain, as in production.
The fixtures are in ``tests/conftest.py`` (``s3_server``: one per test session and xdist
worker; ``s3_bucket``: a fresh bucket per test).
"""

from __future__ import annotations

import logging
import os
import secrets

import pyarrow.fs as pafs

from ledger.storage.object_fs import BucketConfig

__all__ = ["AWS_ENV", "S3Server"]

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "compactd-test-key",
    "AWS_SECRET_ACCESS_KEY": "compactd-test-secret-never-logged",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


class S3Server:
    """moto's S3 server on loopback; ``endpoint`` is its ``http://127.0.0.1:PORT``."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"

    def bucket(self, name: str | None = None, *, prefix: str = "", endpoint: str | None = None) -> BucketConfig:
        """Create a bucket (a fresh random name by default) and return its configuration;
        ``endpoint`` overrides the server's (a fault proxy in front of it)."""
        name = name or f"compactd-{secrets.token_hex(6)}"
        config = BucketConfig("aws-s3", name, prefix, endpoint=self.endpoint, region="us-east-1")
        for key, value in AWS_ENV.items():
            os.environ.setdefault(key, value)
        fs = pafs.S3FileSystem(endpoint_override=self.endpoint.removeprefix("http://"), scheme="http",
                               region="us-east-1", allow_bucket_creation=True)
        fs.create_dir(name)
        if endpoint is not None:
            config = BucketConfig("aws-s3", name, prefix, endpoint=endpoint, region="us-east-1")
        return config

    def stop(self) -> None:
        self._server.stop()
