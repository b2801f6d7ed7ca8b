"""Token keys and verification (``api.auth.tokens``) and ``compactd tokens``.

Tokens are made by the same code ``compactd tokens create`` runs and, for the cases it
never makes (no ``sub``, ``alg: none``, another key), by PyJWT directly. Every refusal is
checked to name its reason and never to carry the token.
"""

from __future__ import annotations

import base64
import os
import stat
import time
from pathlib import Path

import jwt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from api.auth.tokens import (
    KeyFileError,
    TokenError,
    TokenVerifier,
    create_key_pair,
    create_secret_key,
    create_token,
    parse_duration,
    read_key_url,
)
from api.cli import app


@pytest.fixture
def secret_url(tmp_path: Path) -> str:
    path = tmp_path / "secret.key"
    path.write_bytes(create_secret_key())
    return f"file://{path}"


def _key_pair(tmp_path: Path, algorithm: str) -> tuple[str, str]:
    private, public = create_key_pair(algorithm)
    (tmp_path / f"{algorithm}.private").write_bytes(private)
    (tmp_path / f"{algorithm}.public").write_bytes(public)
    return f"file://{tmp_path}/{algorithm}.private", f"file://{tmp_path}/{algorithm}.public"


def test_a_secret_key_token_names_its_subject_as_the_role(secret_url: str) -> None:
    token = create_token("alice", secret_key_url=secret_url)
    assert TokenVerifier.from_urls(secret_url, None).role_of(token) == "alice"
    assert jwt.get_unverified_header(token)["alg"] == "HS256"


@pytest.mark.parametrize("algorithm", ["RS256", "ES256"])
def test_a_key_pair_token_verifies_with_the_public_key_only(tmp_path: Path, algorithm: str) -> None:
    private_url, public_url = _key_pair(tmp_path, algorithm)
    token = create_token("bob", private_key_url=private_url)
    assert jwt.get_unverified_header(token)["alg"] == algorithm
    assert TokenVerifier.from_urls(None, public_url).role_of(token) == "bob"


def test_a_pem_public_key_is_read_too(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    private_url, public_url = _key_pair(tmp_path, "RS256")
    public = serialization.load_der_public_key(read_key_url(public_url))
    pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    data_url = "data:;base64," + base64.b64encode(pem).decode()
    assert TokenVerifier.from_urls(None, data_url).role_of(create_token("c", private_key_url=private_url)) == "c"


def _refusal(verifier: TokenVerifier, token: str) -> str:
    with pytest.raises(TokenError) as caught:
        verifier.role_of(token)
    message = str(caught.value)
    assert token not in message or not token
    return message


def test_an_expired_token_is_refused(secret_url: str) -> None:
    token = create_token("alice", secret_key_url=secret_url, expiry_s=60, now=time.time() - 3600)
    assert "expired" in _refusal(TokenVerifier.from_urls(secret_url, None), token)


def test_an_unexpired_token_with_exp_is_accepted(secret_url: str) -> None:
    token = create_token("alice", secret_key_url=secret_url, expiry_s=3600)
    assert TokenVerifier.from_urls(secret_url, None).role_of(token) == "alice"


def test_a_token_signed_with_another_key_is_refused(tmp_path: Path, secret_url: str) -> None:
    other = tmp_path / "other.key"
    other.write_bytes(create_secret_key())
    token = create_token("alice", secret_key_url=f"file://{other}")
    assert "signature" in _refusal(TokenVerifier.from_urls(secret_url, None), token)


def test_a_token_of_another_key_pair_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    private_url, _ = _key_pair(tmp_path / "a", "ES256")
    _, public_url = _key_pair(tmp_path, "ES256")
    token = create_token("alice", private_key_url=private_url)
    assert "signature" in _refusal(TokenVerifier.from_urls(None, public_url), token)


@pytest.mark.parametrize("token", ["", "garbage", "a.b.c", "eyJhbGciOiJIUzI1NiJ9.e30"])
def test_a_malformed_token_is_refused(secret_url: str, token: str) -> None:
    message = _refusal(TokenVerifier.from_urls(secret_url, None), token)
    assert "malformed" in message or "no token" in message


def test_an_unsigned_token_is_refused(secret_url: str) -> None:
    token = jwt.encode({"sub": "admin"}, key=None, algorithm="none")
    _refusal(TokenVerifier.from_urls(secret_url, None), token)


def test_a_token_without_a_subject_is_refused(secret_url: str) -> None:
    token = jwt.encode({"role": "admin"}, read_key_url(secret_url), algorithm="HS256")
    assert "sub" in _refusal(TokenVerifier.from_urls(secret_url, None), token)


def test_an_hmac_token_is_refused_by_a_public_key_verifier(tmp_path: Path) -> None:
    """The classic confusion: an HS256 token whose secret is the public key's bytes."""
    _, public_url = _key_pair(tmp_path, "RS256")
    forged = jwt.encode({"sub": "admin"}, b"x" * 32, algorithm="HS256")
    _refusal(TokenVerifier.from_urls(None, public_url), forged)


REASONS = {"no token was given", "the token is malformed", "the token has expired",
           "the token's signature does not verify", "the token has no subject (sub) claim",
           "the token is signed with an algorithm this key does not verify",
           "the token's subject (sub) claim is not a role name"}


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=200))
def test_no_text_verifies_without_the_key(text: str) -> None:
    verifier = TokenVerifier(b"k" * 32, ("HS256",))
    with pytest.raises(TokenError) as caught:
        verifier.role_of(text)
    assert str(caught.value) in REASONS  # fixed words: nothing of the token is echoed


def test_key_urls(tmp_path: Path) -> None:
    assert read_key_url("data:;base64,AAEC") == b"\x00\x01\x02"
    assert read_key_url("data:,abc") == b"abc"
    with pytest.raises(KeyFileError, match="cannot read key file"):
        read_key_url(f"file://{tmp_path}/missing")
    with pytest.raises(KeyFileError, match="file:/// or data:"):
        read_key_url("/plain/path")
    (tmp_path / "junk").write_bytes(b"not a key")
    with pytest.raises(KeyFileError, match="neither a PEM nor a DER public key"):
        TokenVerifier.from_urls(None, f"file://{tmp_path}/junk")


@pytest.mark.parametrize(("text", "seconds"), [("30", 30), ("30s", 30), ("5m", 300), ("1h", 3600),
                                               ("2d", 172800), ("1w", 604800), ("1y", 31536000)])
def test_expiry_times_as_pulsar_writes_them(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "-1h", "0s", "1x", "1.5h"])
def test_a_bad_expiry_time_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a time"):
        parse_duration(text)


# -- compactd tokens ---------------------------------------------------------------------

def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_tokens_create_secret_key_then_create_prints_a_verifiable_token(tmp_path: Path) -> None:
    key = tmp_path / "secret.key"
    runner = CliRunner()
    assert runner.invoke(app, ["tokens", "create-secret-key", "--output", str(key)]).exit_code == 0
    assert len(key.read_bytes()) == 32 and _mode(key) == 0o600
    result = runner.invoke(app, ["tokens", "create", "--secret-key", f"file://{key}", "--subject", "ops",
                                 "--expiry-time", "1h"])
    assert result.exit_code == 0, result.output
    token = result.stdout.strip().splitlines()[-1]
    assert TokenVerifier.from_urls(f"file://{key}", None).role_of(token) == "ops"
    assert 3500 < jwt.decode(token, options={"verify_signature": False})["exp"] - time.time() <= 3600


def test_tokens_create_key_pair_then_create_with_the_private_key(tmp_path: Path) -> None:
    private, public = tmp_path / "private.key", tmp_path / "public.key"
    runner = CliRunner()
    result = runner.invoke(app, ["tokens", "create-key-pair", "--output-private-key", str(private),
                                 "--output-public-key", str(public), "--algorithm", "ES256"])
    assert result.exit_code == 0, result.output
    assert _mode(private) == 0o600
    result = runner.invoke(app, ["tokens", "create", "--private-key", f"file://{private}", "--subject", "svc"])
    token = result.stdout.strip().splitlines()[-1]
    assert TokenVerifier.from_urls(None, f"file://{public}").role_of(token) == "svc"
    assert "exp" not in jwt.decode(token, options={"verify_signature": False})


def _words(text: str) -> str:
    return " ".join(text.replace("│", " ").split())  # rich wraps the usage error's box


def test_tokens_create_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["tokens", "create", "--subject", "x"])
    assert result.exit_code == 2 and "exactly one of --secret-key and --private-key" in _words(result.output)
    result = runner.invoke(app, ["tokens", "create", "--secret-key", f"file://{tmp_path}/missing",
                                 "--subject", "x"])
    assert result.exit_code == 1
    assert result.stderr.strip() == f"compactd: cannot read key file {tmp_path}/missing: No such file or directory"
    result = runner.invoke(app, ["tokens", "create", "--secret-key", "data:,k", "--subject", "x",
                                 "--expiry-time", "soon"])
    assert result.exit_code == 2 and "is not a time" in _words(result.output)
