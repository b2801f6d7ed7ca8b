"""The TLS side of both ports, and the start-up check of every key and certificate file.

``broker_ssl_context(settings)`` is the server context of the Pulsar TLS port
(``--broker-port-tls``, ``pulsar+ssl://``); the HTTPS admin port (``--http-port-tls``) gets
the same files through uvicorn (``https_options``). With ``--tls-trust-certs-file`` client
certificates are verified against those CAs; with ``--tls-require-trusted-client-cert`` a
client without one is refused during the handshake (mutual TLS), and on the Pulsar port
the certificate's CN is the role of auth method ``tls``.

``preflight(settings)`` reads the token key and builds the TLS context once, so a missing
or malformed file is a ``ConfigError`` naming the flag before the data dir is touched.
"""

from __future__ import annotations

import ssl
from typing import Any

from api.auth.tokens import KeyFileError, TokenVerifier
from api.config import ConfigError, Settings

__all__ = ["broker_ssl_context", "https_options", "preflight", "tls_enabled"]


def tls_enabled(settings: Settings) -> bool:
    """True when the TLS ports are to be opened (certificate and key given)."""
    return settings.tls_cert_file is not None and settings.tls_key_file is not None


def broker_ssl_context(settings: Settings) -> ssl.SSLContext:
    """The server context of the TLS ports; ``ConfigError`` naming the file that fails."""
    assert settings.tls_cert_file is not None and settings.tls_key_file is not None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(f"--tls-cert-file/--tls-key-file: cannot load {settings.tls_cert_file} with "
                          f"{settings.tls_key_file}: {_why(error)}", key="tls_cert_file",
                          value=settings.tls_cert_file) from None
    if settings.tls_trust_certs_file is not None:
        try:
            context.load_verify_locations(cafile=settings.tls_trust_certs_file)
        except (OSError, ssl.SSLError) as error:
            raise ConfigError(f"--tls-trust-certs-file: cannot load {settings.tls_trust_certs_file}: "
                              f"{_why(error)}", key="tls_trust_certs_file",
                              value=settings.tls_trust_certs_file) from None
        context.verify_mode = ssl.CERT_REQUIRED if settings.tls_require_trusted_client_cert else ssl.CERT_OPTIONAL
    return context


def https_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's TLS options of the HTTPS admin port (the same files as the Pulsar TLS port)."""
    options: dict[str, Any] = {"ssl_certfile": settings.tls_cert_file, "ssl_keyfile": settings.tls_key_file}
    if settings.tls_trust_certs_file is not None:
        options["ssl_ca_certs"] = settings.tls_trust_certs_file
        options["ssl_cert_reqs"] = (ssl.CERT_REQUIRED if settings.tls_require_trusted_client_cert
                                    else ssl.CERT_OPTIONAL)
    return options


def preflight(settings: Settings) -> None:
    """Read the token key and the TLS files once; ``ConfigError`` when one does not load."""
    if settings.authentication_enabled:
        flag = "--token-secret-key" if settings.token_secret_key is not None else "--token-public-key"
        try:
            TokenVerifier.from_urls(settings.token_secret_key, settings.token_public_key)
        except KeyFileError as error:
            raise ConfigError(f"{flag}: {error}", key=flag[2:].replace("-", "_")) from None
    if tls_enabled(settings):
        broker_ssl_context(settings)


def _why(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error)
