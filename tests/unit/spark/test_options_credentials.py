"""The Spark source's credential options: ``tokenFile``, ``username`` + ``password``, one kind at a time,
handed to every Client as the SDK's arguments, and never shown in the options' repr (Spark logs plans)."""

from __future__ import annotations

import pytest

from sluice.errors import InvalidArgument
from sluice.spark.options import parse_options

BASE = {"bootstrap": "h:1", "topic": "t"}


def test_username_and_password_reach_the_client_and_stay_out_of_the_repr() -> None:
    opts = parse_options(
        {**BASE, "UserName": "reader", "password": "s3cret", "tlsCa": "/ca.crt"}, streaming=False
    )
    kwargs = opts.client_kwargs()
    assert kwargs["username"] == "reader"
    assert kwargs["password"] == "s3cret"
    assert kwargs["token"] is None
    assert kwargs["tls"].ca == "/ca.crt"
    assert "s3cret" not in repr(opts)
    assert "reader" in repr(opts)


def test_a_token_file_reaches_the_client_and_a_token_is_hidden() -> None:
    opts = parse_options({**BASE, "tokenFile": "/var/run/token"}, streaming=False)
    assert opts.client_kwargs()["token_file"] == "/var/run/token"
    assert "abc.def" not in repr(parse_options({**BASE, "token": "abc.def"}, streaming=False))


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"token": "x", "tokenFile": "/f"}, "token and tokenFile"),
        ({"token": "x", "username": "u", "password": "p"}, "one kind"),
        ({"tokenFile": "/f", "username": "u", "password": "p"}, "one kind"),
        ({"username": "u"}, "go together"),
        ({"password": "p"}, "go together"),
    ],
)
def test_ambiguous_or_incomplete_credentials_fail_at_planning_time(extra: dict[str, str], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        parse_options({**BASE, **extra}, streaming=False)
