"""JWT keys and tokens, as Pulsar's token authentication provider reads and writes them.

A token is a JWT whose ``sub`` claim is the client's role; ``exp``, when present, is
honoured. Keys are Pulsar's key URLs: ``file:///PATH`` or ``data:[;base64],...``.

* A secret key (HS256) is raw bytes (``create_secret_key`` writes 32 random bytes, as
  ``pulsar tokens create-secret-key`` does).
* A key pair (RS256 or ES256) is written as DER (PKCS#8 private, X.509 public), as Pulsar
  writes them; PEM is read too.

``TokenVerifier.role_of(token)`` is the whole of verification; it raises ``TokenError``
whose message says what was wrong (expired, bad signature, malformed, no subject) and
never carries the token or the key. All cryptography is PyJWT's and ``cryptography``'s.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from api.config import ConfigError
from ledger.errors import CompactionServiceError

__all__ = [
    "KEY_PAIR_ALGORITHMS",
    "SECRET_KEY_BYTES",
    "KeyFileError",
    "TokenError",
    "TokenVerifier",
    "create_key_pair",
    "create_secret_key",
    "create_token",
    "parse_duration",
    "read_key_url",
    "write_owner_only",
]

SECRET_KEY_BYTES = 32  # HS256: a key as long as the hash
KEY_PAIR_ALGORITHMS = ("RS256", "ES256")
RSA_KEY_BITS = 2048
HMAC_ALGORITHMS = ["HS256", "HS384", "HS512"]
RSA_ALGORITHMS = ["RS256", "RS384", "RS512"]
EC_ALGORITHMS = ["ES256", "ES384", "ES512"]
# Pulsar's relative times: 10s, 5m, 1h, 2d, 1w, 1y.
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdwy]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


class KeyFileError(ConfigError):
    """A key URL that cannot be read or is not a key of the expected kind."""


class TokenError(CompactionServiceError):
    """A token that does not authenticate; the message never holds the token."""


def read_key_url(url: str) -> bytes:
    """The bytes a Pulsar key URL names: ``file:///PATH`` or ``data:[;base64],DATA``."""
    if url.startswith("file://"):
        path = urllib.parse.unquote(url[len("file://"):])
        try:
            with open(path, "rb") as file:
                return file.read()
        except OSError as error:
            raise KeyFileError(f"cannot read key file {path}: {error.strerror or error}") from None
    if url.startswith("data:"):
        header, _, data = url[len("data:"):].partition(",")
        if header.endswith(";base64"):
            try:
                return base64.b64decode(data, validate=True)
            except ValueError:
                raise KeyFileError("the data: key is not valid base64") from None
        return urllib.parse.unquote_to_bytes(data)
    raise KeyFileError("a key URL starts with file:/// or data:")


def _public_key(data: bytes) -> Any:
    """The public key in ``data`` (PEM or DER; a private key yields its public half)."""
    loaders = (serialization.load_pem_public_key, serialization.load_der_public_key)
    for loader in loaders:
        try:
            return loader(data)
        except (ValueError, TypeError):
            continue
    raise KeyFileError("the public key is neither a PEM nor a DER public key")


def _private_key(data: bytes) -> Any:
    for loader in (serialization.load_pem_private_key, serialization.load_der_private_key):
        try:
            return loader(data, password=None)
        except (ValueError, TypeError):
            continue
    raise KeyFileError("the private key is neither a PEM nor a DER private key")


def _algorithms_of(key: Any) -> list[str]:
    if isinstance(key, rsa.RSAPublicKey | rsa.RSAPrivateKey):
        return RSA_ALGORITHMS
    if isinstance(key, ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey):
        return EC_ALGORITHMS
    raise KeyFileError("the key is neither an RSA nor an EC key")


@dataclass(frozen=True)
class TokenVerifier:
    """Verifies tokens with one key: an HMAC secret or a public key (see module docstring)."""

    key: Any
    algorithms: tuple[str, ...]

    @classmethod
    def from_urls(cls, secret_key_url: str | None, public_key_url: str | None) -> TokenVerifier:
        """The verifier of ``--token-secret-key`` or ``--token-public-key`` (exactly one)."""
        if secret_key_url is not None:
            secret = read_key_url(secret_key_url)
            if not secret:
                raise KeyFileError("the secret key is empty")
            return cls(secret, tuple(HMAC_ALGORITHMS))
        if public_key_url is None:
            raise KeyFileError("no token key given")
        key = _public_key(read_key_url(public_key_url))
        return cls(key, tuple(_algorithms_of(key)))

    def role_of(self, token: str) -> str:
        """The role (``sub``) of a valid, unexpired token signed by this key; ``TokenError``."""
        if not token:
            raise TokenError("no token was given")
        try:
            claims = jwt.decode(token, self.key, algorithms=list(self.algorithms),
                                options={"require": ["sub"], "verify_aud": False})
        except jwt.ExpiredSignatureError:
            raise TokenError("the token has expired") from None
        except jwt.InvalidSignatureError:
            raise TokenError("the token's signature does not verify") from None
        except jwt.MissingRequiredClaimError:
            raise TokenError("the token has no subject (sub) claim") from None
        except jwt.InvalidAlgorithmError:
            raise TokenError("the token is signed with an algorithm this key does not verify") from None
        except jwt.InvalidTokenError:
            raise TokenError("the token is malformed") from None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise TokenError("the token's subject (sub) claim is not a role name")
        return subject


def create_secret_key() -> bytes:
    """A fresh HS256 secret key: ``SECRET_KEY_BYTES`` random bytes."""
    return secrets.token_bytes(SECRET_KEY_BYTES)


def create_key_pair(algorithm: str = "RS256") -> tuple[bytes, bytes]:
    """A fresh (private, public) key pair for ``algorithm`` (RS256 or ES256), both DER."""
    private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    if algorithm == "RS256":
        private = rsa.generate_private_key(public_exponent=65537, key_size=RSA_KEY_BITS)
    elif algorithm == "ES256":
        private = ec.generate_private_key(ec.SECP256R1())
    else:
        raise KeyFileError(f"algorithm {algorithm!r} is not one of {', '.join(KEY_PAIR_ALGORITHMS)}")
    private_der = private.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
    public_der = private.public_key().public_bytes(serialization.Encoding.DER,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)
    return private_der, public_der


def parse_duration(text: str) -> int:
    """Seconds in a Pulsar relative time (``30s``, ``5m``, ``1h``, ``2d``, ``1w``, ``1y``)."""
    match = _DURATION.match(text)
    if match is None or int(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a time such as 30s, 5m, 1h, 2d, 1w or 1y")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def create_token(subject: str, *, secret_key_url: str | None = None, private_key_url: str | None = None,
                 expiry_s: int | None = None, now: float | None = None) -> str:
    """A token for role ``subject``, signed with the secret key (HS256) or the private key
    (RS256 or ES256, from the key's kind); ``exp`` set when ``expiry_s`` is given."""
    claims: dict[str, Any] = {"sub": subject}
    if expiry_s is not None:
        claims["exp"] = int((time.time() if now is None else now) + expiry_s)
    if secret_key_url is not None:
        return jwt.encode(claims, read_key_url(secret_key_url), algorithm="HS256")
    if private_key_url is None:
        raise KeyFileError("give --secret-key or --private-key")
    key = _private_key(read_key_url(private_key_url))
    return jwt.encode(claims, key, algorithm=_algorithms_of(key)[0])


def write_owner_only(path: str, data: bytes) -> None:
    """Write ``data`` to a new or replaced file at ``path`` readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
