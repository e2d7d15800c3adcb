"""Which credentials a client presents (``sluice.security.credentials``): the precedence of arguments and
environment, the token file that follows rotation, and what a refusal does to each kind of source."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluice.common.client_security import ClientSecurity, refused, retriable_refusal
from sluice.errors import AuthenticationError, CredentialsExpired, InvalidArgument
from sluice.security.credentials import TokenFile, token_source
from sluice.security.scram_login import ScramLogin

BOOT = "127.0.0.1:1"  # never dialled: a ScramLogin logs in at its first call only

ENV = ("SLUICE_TOKEN", "SLUICE_TOKEN_FILE", "SLUICE_USERNAME", "SLUICE_PASSWORD")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _write(path: Path, text: str, mtime_ns: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_a_token_file_is_read_again_only_when_it_changed_and_at_most_once_a_second(tmp_path: Path) -> None:
    path = tmp_path / "token"
    _write(path, "first\n", 1_000_000_000)
    clock = Clock()
    source = TokenFile(path, clock=clock)
    assert source() == "first"
    assert source.reads == 1
    _write(path, "second\n", 2_000_000_000)
    clock.now += 0.5
    assert source() == "first"  # not looked at within the second
    clock.now += 0.6
    assert source() == "second"
    assert source.reads == 2
    clock.now += 5
    assert source() == "second"
    assert source.reads == 2  # unchanged: a stat, no read


def test_a_token_file_that_vanishes_or_empties_keeps_the_last_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    _write(path, "kept", 1_000_000_000)
    clock = Clock()
    source = TokenFile(path, clock=clock)
    _write(path, "", 2_000_000_000)  # the kubelet's rename, seen half-way
    clock.now += 2
    assert source() == "kept"
    path.unlink()
    clock.now += 2
    assert source() == "kept"


def test_a_missing_or_empty_token_file_is_refused_at_once(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="token file"):
        TokenFile(tmp_path / "absent")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(InvalidArgument, match="empty"):
        TokenFile(tmp_path / "empty")


def test_a_refused_token_file_is_looked_at_again_at_the_next_call(tmp_path: Path) -> None:
    path = tmp_path / "token"
    _write(path, "old", 1_000_000_000)
    clock = Clock()
    source = TokenFile(path, clock=clock)
    _write(path, "new", 2_000_000_000)
    assert source() == "old"
    assert refused(ClientSecurity(token=source), "old")
    assert source() == "new"


def test_precedence_arguments_before_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    token_file = tmp_path / "t"
    token_file.write_text("from-file")
    monkeypatch.setenv("SLUICE_TOKEN", "env-token")
    monkeypatch.setenv("SLUICE_USERNAME", "envuser")
    monkeypatch.setenv("SLUICE_PASSWORD", "envpass")
    explicit = token_source(BOOT, None, token="explicit")
    assert explicit is not None
    assert explicit() == "explicit"
    from_file = token_source(BOOT, None, token_file=token_file)
    assert isinstance(from_file, TokenFile)
    assert from_file() == "from-file"
    login = token_source(BOOT, None, username="alice", password="pw")
    assert isinstance(login, ScramLogin)
    assert login.username == "alice"
    env_token = token_source(BOOT, None)
    assert env_token is not None
    assert env_token() == "env-token"
    monkeypatch.delenv("SLUICE_TOKEN")
    monkeypatch.setenv("SLUICE_TOKEN_FILE", str(token_file))
    assert isinstance(token_source(BOOT, None), TokenFile)
    monkeypatch.delenv("SLUICE_TOKEN_FILE")
    env_login = token_source(BOOT, None)
    assert isinstance(env_login, ScramLogin)
    assert env_login.username == "envuser"
    monkeypatch.delenv("SLUICE_USERNAME")
    monkeypatch.delenv("SLUICE_PASSWORD")
    assert token_source(BOOT, None) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"token": "t", "username": "u", "password": "p"}, "not both"),
        ({"token": "t", "token_file": "f"}, "not both"),
        ({"token_file": "f", "username": "u"}, "not both"),
        ({"username": "u"}, "needs a password"),
        ({"password": "p"}, "needs a user name"),
        ({"token": "  "}, "empty"),
    ],
)
def test_ambiguous_or_incomplete_credentials_are_refused(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        token_source(BOOT, None, **kwargs)


def test_a_refusal_at_a_hello_is_retriable_only_for_a_source_that_can_renew() -> None:
    login = ScramLogin(BOOT, "alice", "pw")
    renewable = ClientSecurity(token=login)
    fixed = ClientSecurity(token=lambda: "fixed")
    refusal = AuthenticationError("the session token is invalid or expired")
    assert isinstance(retriable_refusal(renewable, refusal), CredentialsExpired)
    assert retriable_refusal(fixed, refusal) is refusal
    assert retriable_refusal(None, refusal) is refusal
    # A refused TLS session (a certificate) is not the token's fault: never retried.
    tls_refusal = AuthenticationError("TLS handshake failed")
    tls_refusal.__cause__ = OSError("bad certificate")
    assert retriable_refusal(renewable, tls_refusal) is tls_refusal
    login.close()
