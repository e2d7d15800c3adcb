"""The CLI's login flags: ``--username`` and ``--password-file`` (never a password as a flag value), the
environment's password, and ``user add``'s own ``--password-file`` (the new user's) beside the login's."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.cli.commands import build_parser
from sluice.cli.connect import login_from_args
from sluice.cli.errors import UsageError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLUICE_USERNAME", "SLUICE_PASSWORD"):
        monkeypatch.delenv(name, raising=False)


def test_username_and_password_file_before_or_after_the_sub_command(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret\nignored second line\n")
    for argv in (
        ["--username", "alice", "--password-file", str(pw), "topic", "list"],
        ["topic", "list", "--username", "alice", "--password-file", str(pw)],
    ):
        args = build_parser().parse_args(argv)
        assert login_from_args(args) == ("alice", "s3cret")


def test_no_flag_leaves_the_environment_to_the_client() -> None:
    assert login_from_args(build_parser().parse_args(["topic", "list"])) == (None, None)


def test_a_username_takes_the_password_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_PASSWORD", "from-env")
    args = build_parser().parse_args(["--username", "bob", "topic", "list"])
    assert login_from_args(args) == ("bob", "from-env")


def test_an_empty_or_unreadable_password_file_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    for path in (tmp_path / "empty", tmp_path / "absent"):
        args = build_parser().parse_args(["--username", "a", "--password-file", str(path), "topic", "list"])
        with pytest.raises(UsageError, match="--password-file"):
            login_from_args(args)


@pytest.mark.parametrize(
    "argv",
    [
        ["--password", "s3cret", "topic", "list"],
        ["topic", "list", "--password", "s3cret"],
        ["consume", "t", "--passw", "s3cret"],
        ["user", "add", "bob", "--password", "s3cret"],
    ],
)
def test_there_is_no_password_flag_not_even_as_an_abbreviation(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "s3cret" not in err
    assert "--password" in err


def test_user_add_keeps_its_own_password_file_beside_the_logins(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            "--username",
            "admin",
            "--password-file",
            "admin.pw",
            "user",
            "add",
            "bob",
            "--password-file",
            "bob.pw",
        ]
    )
    assert args.username == "admin"
    assert args.login_password_file == Path("admin.pw")
    assert args.password_file == Path("bob.pw")


def test_a_token_file_before_the_sub_command(tmp_path: Path) -> None:
    args = build_parser().parse_args(["--token-file", str(tmp_path / "t"), "topic", "list"])
    assert args.token_file == tmp_path / "t"
