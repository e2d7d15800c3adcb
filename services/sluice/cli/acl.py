"""``sluice acl add|remove|list``: ACL entries, with kafka-acls' flags (docs/security.md, docs/cli.md).

    sluice acl add --principal alice --topic orders --operation read --operation write
    sluice acl add --principal '*' --group app- --prefixed --operation read --deny
    sluice acl list --principal alice --format json
    sluice acl remove --principal alice --topic orders

``add`` makes one entry per principal and operation. ``list`` and ``remove`` take the same flags as a filter:
a flag left out matches anything; a resource name matches literal entries unless ``--prefixed``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sluice.cli.connect import connect
from sluice.cli.errors import UsageError
from sluice.security.acl import ALL, WILDCARD, AclEntry, AclFilter, PatternType, Permission, parse_operation
from sluice.security.model import Operation, ResourceType

OPERATIONS = [op.value for op in Operation] + [ALL.value]
COLUMNS = ("PRINCIPAL", "RESOURCE", "PATTERN", "NAME", "OPERATION", "PERMISSION")


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    acl = subparsers.add_parser("acl", help="ACL authorization: add, remove, list entries", parents=[common])
    actions = acl.add_subparsers(dest="action", metavar="ACTION", required=True)

    add = actions.add_parser("add", help="allow (or with --deny, refuse) operations", parents=[common])
    _add_flags(add, filtering=False)
    add.set_defaults(run=run_add, parser=add)

    remove = actions.add_parser("remove", help="remove the entries the flags select", parents=[common])
    _add_flags(remove, filtering=True)
    remove.set_defaults(run=run_remove, parser=remove)

    lst = actions.add_parser(
        "list", help="list the entries the flags select (all without flags)", parents=[common]
    )
    _add_flags(lst, filtering=True)
    lst.set_defaults(run=run_list, parser=lst)


def _add_flags(parser: argparse.ArgumentParser, *, filtering: bool) -> None:
    parser.add_argument(
        "--principal",
        action="append",
        metavar="NAME",
        help="a principal (a user, a certificate's mapped name, a JWT subject), or '*': anyone "
        "authenticated" + (" (repeatable)" if not filtering else ""),
    )
    resource = parser.add_mutually_exclusive_group(required=not filtering)
    resource.add_argument("--topic", metavar="NAME", help="a topic ('*': every topic)")
    resource.add_argument("--group", metavar="NAME", help="a consumer group ('*': every group)")
    resource.add_argument("--subscription", metavar="NAME", help="a push subscription ('*': every one)")
    resource.add_argument("--cluster", action="store_true", help="the cluster")
    parser.add_argument(
        "--prefixed", action="store_true", help="NAME is a prefix: every name starting with it"
    )
    parser.add_argument(
        "--operation",
        action="append",
        choices=OPERATIONS,
        metavar="OP",
        help=f"one of {', '.join(OPERATIONS)} (repeatable)",
    )
    permission = parser.add_mutually_exclusive_group()
    permission.add_argument("--deny", action="store_true", help="a deny entry: wins over every allow")
    if filtering:
        permission.add_argument("--allow", action="store_true", help="allow entries only")
    parser.add_argument("--format", "-f", choices=("text", "json"), default="text", help="output format")
    parser.add_argument("--json", dest="format", action="store_const", const="json", help="= --format json")


def _resource(args: argparse.Namespace) -> tuple[ResourceType | None, str | None]:
    if args.cluster:
        return ResourceType.CLUSTER, WILDCARD
    for rtype in (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.SUBSCRIPTION):
        name = getattr(args, rtype.value)
        if name is not None:
            return rtype, name
    return None, None


def _pattern(args: argparse.Namespace, name: str | None) -> PatternType | None:
    if args.prefixed:
        if name is None or args.cluster:
            raise UsageError("--prefixed needs --topic, --group or --subscription")
        return PatternType.PREFIXED
    return PatternType.LITERAL if name is not None else None


def _filters(args: argparse.Namespace) -> list[AclFilter]:
    rtype, name = _resource(args)
    pattern = _pattern(args, name)
    permission = Permission.DENY if args.deny else Permission.ALLOW if args.allow else None
    principals: list[str | None] = list(args.principal or [None])
    operations: list[Any] = [parse_operation(op) for op in args.operation or []] or [None]
    return [
        AclFilter(
            principal=p, resource_type=rtype, pattern=pattern, name=name, operation=op, permission=permission
        )
        for p in principals
        for op in operations
    ]


def run_add(args: argparse.Namespace) -> int:
    if not args.principal:
        raise UsageError("give at least one --principal")
    if not args.operation:
        raise UsageError("give at least one --operation")
    rtype, name = _resource(args)
    if rtype is None or name is None:  # argparse requires one of the resource flags: never here
        raise UsageError("give --topic, --group, --subscription or --cluster")
    pattern = _pattern(args, name) or PatternType.LITERAL
    permission = Permission.DENY if args.deny else Permission.ALLOW
    entries = [
        AclEntry.of(principal, rtype, name, op, permission, pattern)
        for principal in args.principal
        for op in args.operation
    ]
    with connect(args) as client:
        version = client.admin.create_acls(entries)
    if args.format == "json":
        _print_json({"acls": [e.to_dict() for e in entries], "version": version})
    else:
        print(
            f"Added {len(entries)} ACL entr{'y' if len(entries) == 1 else 'ies'} (security version {version})"
        )
        _table(entries)
    return 0


def run_remove(args: argparse.Namespace) -> int:
    filters = _filters(args)
    if not (args.principal or args.operation or _resource(args)[0] or args.deny or args.allow):
        raise UsageError(
            "give a --principal, a resource, --operation, --deny or --allow to select what to remove"
        )
    with connect(args) as client:
        removed = client.admin.delete_acls(filters)
    if args.format == "json":
        _print_json([e.to_dict() for e in removed])
    else:
        print(f"Removed {len(removed)} ACL entr{'y' if len(removed) == 1 else 'ies'}")
        _table(removed)
    return 0


def run_list(args: argparse.Namespace) -> int:
    filters = _filters(args)
    with connect(args) as client:
        found: dict[tuple[str, ...], AclEntry] = {}
        for flt in filters:  # several principals or operations: one question each, merged
            found.update((e.key, e) for e in client.admin.describe_acls(flt))
    entries = sorted(found.values())
    if args.format == "json":
        _print_json([e.to_dict() for e in entries])
    else:
        _table(entries)
    return 0


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


def _table(entries: list[AclEntry]) -> None:
    if not entries:
        return
    rows = [COLUMNS, *(e.key for e in entries)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
