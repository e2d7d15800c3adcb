"""The one place the CLI builds an SDK client, so every command connects the same way."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from sluice import DEFAULT_BOOTSTRAP
from sluice.cli.errors import UsageError
from sluice.common.client_security import TLSConfig
from sluice.errors import SluiceError

if TYPE_CHECKING:
    from sluice.client.client import Client

CLIENT_ID = "sluice-cli"
DEFAULT_REQUEST_TIMEOUT = 30.0


#: The CLI's TLS flags and the TLSConfig field each sets (the environment, ``SLUICE_TLS_*``, when
#: none of them is given; docs/security.md).
TLS_FLAGS = {
    "--tls-ca": ("ca", "CA bundle verifying the services' certificates (default: $SLUICE_TLS_CA)"),
    "--tls-cert": ("cert", "client certificate, for mTLS (default: $SLUICE_TLS_CERT)"),
    "--tls-key": ("key", "key of --tls-cert (default: $SLUICE_TLS_KEY)"),
    "--tls-server-name": (
        "server_name",
        "name to verify in the services' certificates instead of the address (default: "
        "$SLUICE_TLS_SERVER_NAME)",
    ),
}


def add_security_arguments(parser: argparse.ArgumentParser, hidden: bool, password_file: bool = True) -> None:
    """``--tls-*``, ``--token``, ``--token-file``, ``--username`` and ``--password-file``; ``hidden``:
    the copies on each sub-command (never overwriting the top-level value)."""
    for flag, (field, text) in TLS_FLAGS.items():
        parser.add_argument(
            flag,
            dest=f"tls_{field}",
            default=argparse.SUPPRESS if hidden else None,
            metavar="PATH" if field != "server_name" else "NAME",
            help=argparse.SUPPRESS if hidden else text,
        )
    parser.add_argument(
        "--token",
        default=argparse.SUPPRESS if hidden else None,
        help=argparse.SUPPRESS if hidden else "bearer token (default: $SLUICE_TOKEN)",
    )
    if not hidden:
        # Before the sub-command only: on the sub-commands a second --token... option would make the
        # abbreviation `--to` of their own `--to` flags ambiguous.
        parser.add_argument(
            "--token-file",
            type=Path,
            metavar="FILE",
            help="file holding the bearer token, read again when it changes (default: $SLUICE_TOKEN_FILE)",
        )
    parser.add_argument(
        "--username",
        default=argparse.SUPPRESS if hidden else None,
        metavar="NAME",
        help=argparse.SUPPRESS if hidden else "log in as this SCRAM user (default: $SLUICE_USERNAME)",
    )
    # An exact --password, so that no sub-command takes it as an abbreviation of --password-file
    # (argparse's prefix matching) and a password typed there is refused, never used or echoed.
    parser.add_argument("--password", action=_RefusePassword, nargs="?", help=argparse.SUPPRESS)
    if password_file:
        add_password_file_argument(parser, hidden)


class _RefusePassword(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        parser.error(
            "there is no --password flag (a command line is visible to every user of the machine): "
            "use --password-file FILE or the environment variable SLUICE_PASSWORD"
        )


def add_password_file_argument(parser: argparse.ArgumentParser, hidden: bool) -> None:
    """The login's ``--password-file``. Never the password itself as a flag value: a command line is
    visible to every user of the machine (``ps``)."""
    parser.add_argument(
        "--password-file",
        dest="login_password_file",
        type=Path,
        default=argparse.SUPPRESS if hidden else None,
        metavar="FILE",
        help=argparse.SUPPRESS
        if hidden
        else "read --username's password from FILE (default: $SLUICE_PASSWORD)",
    )


def tls_from_args(args: argparse.Namespace) -> TLSConfig | None:
    """The TLS the flags give; None (the environment's, or plaintext) when no flag is given."""
    values = {field: getattr(args, f"tls_{field}", None) for field, _ in TLS_FLAGS.values()}
    if not any(values.values()):
        return None
    return TLSConfig(**values)


def login_from_args(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(user name, password) from ``--username`` and ``--password-file``; (None, None) when neither
    is given (the Client then looks at the environment). The environment's password serves a
    ``--username`` given without a file."""
    username: str | None = getattr(args, "username", None)
    password_file: Path | None = getattr(args, "login_password_file", None)
    if username is None and password_file is None:
        return None, None
    if username is None:
        username = os.environ.get("SLUICE_USERNAME") or None
    if password_file is None:
        return username, os.environ.get("SLUICE_PASSWORD") or None
    try:
        text = password_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read --password-file {password_file}: {exc}") from None
    password = text.splitlines()[0] if text.strip("\r\n") else ""
    if not password:
        raise UsageError(f"--password-file {password_file} is empty")
    return username, password


def default_bootstrap() -> str:
    """``SLUICE_BOOTSTRAP`` if set, else the contract's default ``127.0.0.1:7600``."""
    return os.environ.get("SLUICE_BOOTSTRAP") or DEFAULT_BOOTSTRAP


@contextlib.contextmanager
def connect(args: argparse.Namespace) -> Iterator[Client]:
    """A client for ``--bootstrap``, closed when the command ends (also on errors and Ctrl-C)."""
    # Imported here: the SDK pulls in gRPC, which `sluice up` and `--help` do not need.
    from sluice import Client
    from sluice.cli.reach import preflight, wrong_port_error

    preflight(args.bootstrap, args.request_timeout)
    username, password = login_from_args(args)
    client = Client(
        args.bootstrap,
        client_id=CLIENT_ID,
        request_timeout=args.request_timeout,
        tls=tls_from_args(args),
        token=getattr(args, "token", None),
        token_file=getattr(args, "token_file", None),
        username=username,
        password=password,
    )
    try:
        yield client
    except SluiceError as exc:
        if str(exc.message).startswith("UNIMPLEMENTED"):
            raise wrong_port_error(args.bootstrap, exc.message) from None
        raise
    finally:
        client.close()
