"""The user sub-commands of ``sluice``: topic, produce, consume, up, subscription, group, track, acl, user.

``sluice.cli.main`` sends every sub-command that is not a service here. Each
command group lives in its own module with ``add_parser(subparsers, common)``;
this module only assembles the parser and turns outcomes into exit codes:

* 0: success;
* 1: a typed error, printed as ``error: <CODE>: <message>`` (no traceback);
* 2: a usage error (argparse, or a bad combination found later);
* 130: interrupted with Ctrl-C;
* 141: the reader of stdout went away (``sluice consume ... | head``), like SIGPIPE.
"""

from __future__ import annotations

import argparse
import os
import sys

from sluice.cli import acl, consume, dlq, group, produce, quota, subscription, topic, track, up, user
from sluice.cli.connect import (
    DEFAULT_REQUEST_TIMEOUT,
    add_password_file_argument,
    add_security_arguments,
    default_bootstrap,
)
from sluice.cli.errors import UsageError
from sluice.cli.output import positive_float
from sluice.cli.positions import join_dash_values
from sluice.errors import SluiceError

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141


def build_parser() -> argparse.ArgumentParser:
    # --bootstrap and --request-timeout are accepted before or after the sub-command.
    # The copies on each sub-command default to SUPPRESS so they never overwrite the
    # top-level value.
    common_base = argparse.ArgumentParser(add_help=False)
    common_base.add_argument(
        "--bootstrap", "-b", default=argparse.SUPPRESS, metavar="HOST:PORT", help=argparse.SUPPRESS
    )
    common_base.add_argument(
        "--request-timeout",
        type=positive_float,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help=argparse.SUPPRESS,
    )
    add_security_arguments(common_base, hidden=True, password_file=False)
    common = argparse.ArgumentParser(add_help=False, parents=[common_base])
    add_password_file_argument(common, hidden=True)

    parser = argparse.ArgumentParser(
        prog="sluice",
        description="Sluice: a partitioned log with pull groups and push subscriptions.",
        epilog="Services (what containers run): sluice broker|coordinator|offset-store|dispatcher --help",
        # No abbreviations at the top: `sluice up --tls` would be an ambiguous prefix of --tls-ca...
        # (argparse looks at every option of the command line, the sub-command's too).
        allow_abbrev=False,
    )
    parser.add_argument(
        "--bootstrap",
        "-b",
        default=default_bootstrap(),
        metavar="HOST:PORT",
        help="coordinator address (default: $SLUICE_BOOTSTRAP or 127.0.0.1:7600)",
    )
    parser.add_argument(
        "--request-timeout",
        type=positive_float,
        default=DEFAULT_REQUEST_TIMEOUT,
        metavar="SECONDS",
        help="how long one request may wait for an unreachable service (default 30)",
    )
    add_security_arguments(parser, hidden=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    up.add_parser(sub, common)
    topic.add_parser(sub, common)
    produce.add_parser(sub, common)
    consume.add_parser(sub, common)
    subscription.add_parser(sub, common)
    group.add_parser(sub, common)
    dlq.add_parser(sub, common)
    track.add_parser(sub, common)
    acl.add_parser(sub, common)
    quota.add_parser(sub, common)
    user.add_parser(sub, common, common_base)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(join_dash_values(sys.argv[1:] if argv is None else argv))
    try:
        return int(args.run(args))
    except UsageError as exc:
        args.parser.print_usage(sys.stderr)
        print(f"{args.parser.prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SluiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # Python would complain again when it flushes stdout at exit; point it at
        # /dev/null so the reader going away stays silent.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
