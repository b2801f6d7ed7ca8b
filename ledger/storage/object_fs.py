"""Where object storage is, and how to open it: the one factory of ``pyarrow.fs`` filesystems.

Everything compactd keeps outside its data dir (offloaded ledgers, their key indexes,
compacted ledgers written by Spark executors, backups) goes through a ``pyarrow.fs``
filesystem opened here from a ``BucketConfig``. Drivers carry Pulsar's names
(``managedLedgerOffloadDriver``):

* ``aws-s3`` (alias ``s3``): an S3 or S3-compatible store. ``bucket`` is the bucket's
  name; ``endpoint`` overrides AWS's (``http://127.0.0.1:9000`` for MinIO or moto; the
  scheme picks TLS), ``region`` its region, ``tls_ca_file`` a CA bundle for an
  endpoint with a private certificate. Credentials are never settings: the AWS SDK's
  default chain finds them (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
  ``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` and ``~/.aws``, a web identity or an instance
  profile), so none is ever in a command line, a log or a stats document.
* ``filesystem``: a directory (``bucket`` is its absolute path), local or a mount that
  every Spark executor sees; the same code paths, with no network.

``prefix`` (no leading or trailing ``/``) is prepended to every object's name, so one
bucket can hold several clusters. ``base`` is the path, on the filesystem ``open``
returns, under which a caller names its objects (``base + "/" + name``). A writer calls
``create_dir(parent, recursive=True)`` before its first object under a new parent: a
no-op on S3, needed by a directory.

``BucketConfig.from_url`` reads ``s3://bucket/prefix`` and ``file:///dir`` forms (a
backup's ``--to``), ``to_url`` writes them back; neither ever carries a credential.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:  # loaded by ``open``: a broker without a bucket never imports pyarrow
    import pyarrow.fs as pafs

__all__ = ["DRIVERS", "BucketConfig", "BucketConfigError"]

DRIVERS = ("aws-s3", "filesystem")
"""The drivers compactd knows (Pulsar's names; ``s3`` is read as ``aws-s3``)."""

_ALIASES = {"s3": "aws-s3", "aws-s3": "aws-s3", "filesystem": "filesystem"}
# Seconds the S3 client waits to connect and for a request, and its tries per request
# (the AWS SDK's standard retry strategy: exponential backoff with jitter on 5xx,
# throttling and connection errors).
_CONNECT_TIMEOUT_S = 5.0
_REQUEST_TIMEOUT_S = 30.0
_S3_ATTEMPTS_MAX = 5


class BucketConfigError(ValueError):
    """A bucket configuration or URL that cannot be used; the message names the value."""


@dataclass(frozen=True, slots=True)
class BucketConfig:
    """One object store location (see the module docstring). Validated on construction."""

    driver: str
    bucket: str
    prefix: str = ""
    endpoint: str | None = None
    region: str | None = None
    tls_ca_file: str | None = None

    def __post_init__(self) -> None:
        driver = _ALIASES.get(self.driver.strip().lower()) if self.driver else None
        if driver is None:
            raise BucketConfigError(f"unknown offload driver {self.driver!r}; one of {', '.join(DRIVERS)}")
        object.__setattr__(self, "driver", driver)
        if not self.bucket:
            raise BucketConfigError(f"the {driver} driver needs a bucket (or, for filesystem, a directory)")
        if driver == "filesystem" and not os.path.isabs(self.bucket):
            raise BucketConfigError(f"the filesystem driver's directory must be absolute: {self.bucket!r}")
        if driver == "aws-s3" and "/" in self.bucket:
            raise BucketConfigError(f"an S3 bucket name has no '/': {self.bucket!r}")
        object.__setattr__(self, "prefix", self.prefix.strip("/"))
        if self.endpoint is not None and urlsplit(self.endpoint).scheme not in ("http", "https"):
            raise BucketConfigError(f"the endpoint must be an http:// or https:// URL: {self.endpoint!r}")

    @classmethod
    def from_url(cls, url: str, *, endpoint: str | None = None, region: str | None = None,
                 tls_ca_file: str | None = None) -> BucketConfig:
        """``s3://bucket[/prefix]`` or ``file:///absolute/dir``; BucketConfigError otherwise."""
        parts = urlsplit(url)
        if parts.scheme in ("s3", "s3a"):
            if parts.username or parts.password:
                raise BucketConfigError("credentials do not belong in the URL; use the AWS_* environment")
            return cls("aws-s3", parts.netloc, parts.path, endpoint, region, tls_ca_file)
        if parts.scheme == "file" and parts.netloc in ("", "localhost"):
            return cls("filesystem", parts.path or "/")
        raise BucketConfigError(f"not an s3:// or file:/// URL: {url!r}")

    def to_url(self) -> str:
        """The URL ``from_url`` reads back (no credentials, no endpoint)."""
        if self.driver == "filesystem":
            return "file://" + os.path.join(self.bucket, self.prefix).rstrip("/")
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    @property
    def base(self) -> str:
        """The path under which objects are named on ``open()``'s filesystem."""
        root = self.bucket.rstrip("/") if self.driver == "filesystem" else self.bucket
        return f"{root}/{self.prefix}" if self.prefix else root

    def open(self) -> pafs.FileSystem:
        """A filesystem for this location (no I/O yet for S3; the directory is created for
        ``filesystem``). Credentials come from the default chain, never from here."""
        import pyarrow.fs as pafs

        if self.driver == "filesystem":
            os.makedirs(self.base, exist_ok=True)
            return pafs.LocalFileSystem()
        scheme = None
        endpoint = None
        if self.endpoint is not None:
            parts = urlsplit(self.endpoint)
            scheme, endpoint = parts.scheme, parts.netloc
        return pafs.S3FileSystem(
            region=self.region, scheme=scheme, endpoint_override=endpoint,
            connect_timeout=_CONNECT_TIMEOUT_S, request_timeout=_REQUEST_TIMEOUT_S,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=_S3_ATTEMPTS_MAX),
            tls_ca_file_path=self.tls_ca_file)
