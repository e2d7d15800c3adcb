"""``sluice quota set|list|delete``: client quotas (docs/quotas.md, docs/cli.md).

    sluice quota set --user alice --produce-rate 2MiB --fetch-rate 10MiB
    sluice quota set --client-id batch-loader --request-rate 100
    sluice quota set --default-client --produce-rate 1MiB      # every client id without its own
    sluice quota list [--user|--client] [--format json]
    sluice quota delete --user alice

``set`` replaces the entity's limits with those given (a limit not given is removed: unlimited), as
``kafka-configs --alter --add-config`` on one entity, so the command line is the whole truth.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sluice.cli.connect import connect
from sluice.cli.errors import UsageError
from sluice.common.units import parse_size
from sluice.errors import InvalidArgument
from sluice.quotas.model import Kind, Limits, QuotaKey

COLUMNS = ("ENTITY", "PRODUCE B/S", "FETCH B/S", "REQUESTS/S", "SUBSCRIBES/S")


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    quota = subparsers.add_parser("quota", help="client quotas: set, list, delete", parents=[common])
    actions = quota.add_subparsers(dest="action", metavar="ACTION", required=True)

    st = actions.add_parser("set", help="set (replace) an entity's limits", parents=[common])
    _entity_flags(st)
    st.add_argument("--produce-rate", metavar="SIZE", help="produced bytes per second (e.g. 2MiB)")
    st.add_argument("--fetch-rate", metavar="SIZE", help="fetched bytes per second (consumers)")
    st.add_argument("--request-rate", type=float, metavar="N", help="produce and fetch requests per second")
    st.add_argument("--subscribe-rate", type=float, metavar="N", help="dispatcher Subscribe calls per second")
    _format_flags(st)
    st.set_defaults(run=run_set, parser=st)

    delete = actions.add_parser("delete", help="remove every limit of an entity", parents=[common])
    _entity_flags(delete)
    _format_flags(delete)
    delete.set_defaults(run=run_delete, parser=delete)

    lst = actions.add_parser("list", help="list the quotas", parents=[common])
    kind = lst.add_mutually_exclusive_group()
    kind.add_argument("--user", dest="kind", action="store_const", const=Kind.USER, help="user quotas only")
    kind.add_argument(
        "--client", dest="kind", action="store_const", const=Kind.CLIENT, help="client-id quotas only"
    )
    _format_flags(lst)
    lst.set_defaults(run=run_list, parser=lst)


def _entity_flags(parser: argparse.ArgumentParser) -> None:
    entity = parser.add_mutually_exclusive_group(required=True)
    entity.add_argument("--user", metavar="NAME", help="an authenticated principal")
    entity.add_argument("--client-id", metavar="ID", help="a client id (what anonymous callers are known by)")
    entity.add_argument("--default-user", action="store_true", help="every user without a quota of its own")
    entity.add_argument(
        "--default-client", action="store_true", help="every client id without a quota of its own"
    )


def _format_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", "-f", choices=("text", "json"), default="text", help="output format")
    parser.add_argument("--json", dest="format", action="store_const", const="json", help="= --format json")


def _entity(args: argparse.Namespace) -> QuotaKey:
    if args.default_user:
        return QuotaKey(Kind.USER, "")
    if args.default_client:
        return QuotaKey(Kind.CLIENT, "")
    if args.user is not None:
        if not args.user:
            raise UsageError("--user needs a name (--default-user: every user)")
        return QuotaKey(Kind.USER, args.user)
    if not args.client_id:
        raise UsageError("--client-id needs an id (--default-client: every client id)")
    return QuotaKey(Kind.CLIENT, args.client_id)


def _size(text: str | None, flag: str) -> float:
    if text is None:
        return 0.0
    try:
        return float(parse_size(text))
    except InvalidArgument as exc:
        raise UsageError(f"{flag}: {exc.message}") from None


def _rate(value: float | None, flag: str) -> float:
    if value is None:
        return 0.0
    if not value >= 0 or value == float("inf"):
        raise UsageError(f"{flag} must be a finite number >= 0")
    return value


def run_set(args: argparse.Namespace) -> int:
    key = _entity(args)
    limits = Limits(
        produce_bytes_per_second=_size(args.produce_rate, "--produce-rate"),
        fetch_bytes_per_second=_size(args.fetch_rate, "--fetch-rate"),
        requests_per_second=_rate(args.request_rate, "--request-rate"),
        subscribes_per_second=_rate(args.subscribe_rate, "--subscribe-rate"),
    )
    if limits.empty:
        raise UsageError(
            "give at least one of --produce-rate, --fetch-rate, --request-rate, --subscribe-rate "
            "(sluice quota delete removes a quota)"
        )
    with connect(args) as client:
        version = client.admin.alter_quotas({key: limits})
    if args.format == "json":
        _print_json({"entity": _entity_doc(key), "limits": limits.to_dict(), "version": version})
    else:
        print(f"Set the quota of {key} (quota version {version})")
        _table({key: limits})
    return 0


def run_delete(args: argparse.Namespace) -> int:
    key = _entity(args)
    with connect(args) as client:
        deleted = client.admin.delete_quotas([key])
    if args.format == "json":
        _print_json({"entity": _entity_doc(key), "deleted": deleted})
    else:
        print(f"Deleted the quota of {key}" if deleted else f"{key} had no quota")
    return 0


def run_list(args: argparse.Namespace) -> int:
    with connect(args) as client:
        quotas = client.admin.describe_quotas(args.kind)
    if args.format == "json":
        _print_json([{"entity": _entity_doc(k), "limits": v.to_dict()} for k, v in quotas.items()])
    else:
        _table(quotas)
    return 0


def _entity_doc(key: QuotaKey) -> dict[str, Any]:
    return {"kind": key.kind.value, "name": key.name, "default": not key.name}


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


def _cell(value: float) -> str:
    return "-" if not value else f"{value:g}"


def _table(quotas: dict[QuotaKey, Limits]) -> None:
    if not quotas:
        return
    rows = [COLUMNS] + [
        (
            str(k),
            _cell(v.produce_bytes_per_second),
            _cell(v.fetch_bytes_per_second),
            _cell(v.requests_per_second),
            _cell(v.subscribes_per_second),
        )
        for k, v in sorted(quotas.items(), key=lambda kv: (kv[0].kind.value, kv[0].name))
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
