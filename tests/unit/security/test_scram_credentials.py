"""SCRAM credentials computed on the client: a scramp server accepts the password they were made from and
nothing else; every field out of bounds is a typed error naming it."""

from __future__ import annotations

import dataclasses

import pytest
from scramp import ScramClient, ScramException, ScramMechanism

from sluice.errors import InvalidArgument
from sluice.security.scram import MECHANISM, ScramCredential, make_credential, validate_user_name


def exchange(credential: ScramCredential, password: str) -> bool:
    c = credential
    server = ScramMechanism(MECHANISM).make_server(
        lambda _user: (c.salt, c.stored_key, c.server_key, c.iterations)
    )
    client = ScramClient([MECHANISM], "alice", password)
    server.set_client_first(client.get_client_first())
    client.set_server_first(server.get_server_first())
    try:
        server.set_client_final(client.get_client_final())
    except ScramException:
        return False
    client.set_server_final(server.get_server_final())  # the server proves it holds the credential
    return True


def test_the_credential_logs_in_with_its_password_only() -> None:
    credential = make_credential("correct horse", 4096)
    assert credential.validate() is credential
    assert exchange(credential, "correct horse")
    assert not exchange(credential, "correct horse ")


def test_salts_are_fresh_and_the_password_is_nowhere_in_the_credential() -> None:
    a, b = make_credential("same", 4096), make_credential("same", 4096)
    assert a.salt != b.salt
    assert a.stored_key != b.stored_key
    assert b"same" not in a.salt + a.stored_key + a.server_key


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"mechanism": "SCRAM-SHA-1"}, "mechanism"),
        ({"salt": b"short"}, "salt"),
        ({"salt": b"x" * 65}, "salt"),
        ({"iterations": 4095}, "iterations"),
        ({"iterations": 1_000_001}, "iterations"),
        ({"stored_key": b"x" * 31}, "stored_key"),
        ({"server_key": b""}, "server_key"),
    ],
)
def test_out_of_bounds_fields_are_named(change: dict[str, object], field: str) -> None:
    bad = dataclasses.replace(make_credential("pw", 4096), **change)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=field):
        bad.validate()


@pytest.mark.parametrize("password", ["", "control\x07char"])
def test_unusable_passwords_are_refused(password: str) -> None:
    with pytest.raises(InvalidArgument):
        make_credential(password, 4096)


@pytest.mark.parametrize("iterations", [100, True, 2_000_000])
def test_bad_iteration_counts_are_refused(iterations: int) -> None:
    with pytest.raises(InvalidArgument, match="iterations"):
        make_credential("pw", iterations)


@pytest.mark.parametrize("name", ["alice", "a.b-c_d", "ops@example.com", "x" * 128])
def test_good_user_names(name: str) -> None:
    assert validate_user_name(name) == name


@pytest.mark.parametrize("name", ["", "with space", "a,b", "a=b", "x" * 129, None, "ü"])
def test_bad_user_names(name: object) -> None:
    with pytest.raises(InvalidArgument):
        validate_user_name(name)
