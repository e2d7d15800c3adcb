"""``sluice user add|delete|list``: SCRAM users (docs/security.md, "Passwords (SCRAM) and session tokens").

The password is read from ``--password-file``, from stdin when stdin is not a terminal (a pipe, a here
string), or from an interactive prompt that asks twice. Never from a flag's value: a command line is
visible to every user of the machine (``ps``) and lands in shell histories. The CLI computes the SCRAM
credential itself, so the password never reaches the coordinator.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from pathlib import Path
from typing import Any

from sluice.cli.connect import connect
from sluice.cli.errors import CliError, UsageError
from sluice.security.scram import DEFAULT_ITERATIONS

__all__ = ["add_parser", "read_password"]


def add_parser(
    subparsers: Any, common: argparse.ArgumentParser, add_common: argparse.ArgumentParser | None = None
) -> None:
    """``add_common``: ``common`` without the login's ``--password-file``: after ``user add`` that flag
    is the new user's password, so the login's goes before the sub-command there
    (``sluice --username admin --password-file admin.pw user add bob --password-file bob.pw``)."""
    p = subparsers.add_parser("user", help="manage SCRAM users (add, delete, list)", parents=[common])
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    add = actions.add_parser(
        "add",
        help="create a user or set its password (its sessions end)",
        parents=[add_common or common],
        # No "--password" abbreviating --password-file: a password typed as a flag value is refused.
        allow_abbrev=False,
        description="The password comes from --password-file, else stdin if it is not a terminal, "
        "else a prompt. There is no flag that takes the password itself.",
    )
    add.add_argument("name", metavar="NAME")
    add.add_argument("--password-file", type=Path, metavar="FILE", help="read the password from FILE")
    add.add_argument(
        "--iterations",
        type=int,
        default=DEFAULT_ITERATIONS,
        metavar="N",
        help=f"PBKDF2 iterations of the credential (default {DEFAULT_ITERATIONS}, at least 4096)",
    )
    add.set_defaults(run=run_add, parser=add)

    delete = actions.add_parser("delete", help="delete a user (its sessions end)", parents=[common])
    delete.add_argument("name", metavar="NAME")
    delete.set_defaults(run=run_delete, parser=delete)

    ls = actions.add_parser(
        "list", help="list users (name, mechanism, iterations, generation)", parents=[common]
    )
    ls.add_argument("--format", "-f", choices=("text", "json"), default="text", help="output format")
    ls.set_defaults(run=run_list, parser=ls)


def read_password(password_file: Path | None) -> str:
    """The password from the file, a piped stdin, or a prompt (asked twice); without its line end."""
    if password_file is not None:
        try:
            text = password_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read --password-file {password_file}: {exc}") from None
        password = text.splitlines()[0] if text.strip("\r\n") else ""
    elif not sys.stdin.isatty():
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass("Password: ")
        if getpass.getpass("Password (again): ") != password:
            raise UsageError("the passwords do not match")
    if not password:
        raise UsageError("the password is empty")
    return password


def run_add(args: argparse.Namespace) -> int:
    password = read_password(args.password_file)
    with connect(args) as client:
        change = client.admin.upsert_user(args.name, password, args.iterations)
    verb = "Created user" if change.changed else "Changed the password of user"
    print(f"{verb} {change.name} (generation {change.generation})")
    return 0


def run_delete(args: argparse.Namespace) -> int:
    with connect(args) as client:
        change = client.admin.delete_user(args.name)
    if not change.changed:
        raise CliError("UNKNOWN_USER", f"no user named {args.name!r}")
    print(f"Deleted user {change.name} (generation {change.generation})")
    return 0


def run_list(args: argparse.Namespace) -> int:
    with connect(args) as client:
        users = client.admin.list_users()
    if args.format == "json":
        for u in users:
            doc = {
                "name": u.name,
                "mechanism": u.mechanism,
                "iterations": u.iterations,
                "generation": u.generation,
            }
            print(json.dumps(doc))
        return 0
    if not users:
        print("No users.")
        return 0
    width = max(4, *(len(u.name) for u in users))
    print(f"{'NAME':<{width}}  {'MECHANISM':<13}  {'ITERATIONS':>10}  GENERATION")
    for u in users:
        print(f"{u.name:<{width}}  {u.mechanism:<13}  {u.iterations:>10}  {u.generation}")
    return 0
