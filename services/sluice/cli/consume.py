"""``sluice consume TOPIC``: print a topic's records, one line each.

Without ``--group`` or ``--subscription`` it reads every partition (or those given
with ``--partition``) from ``--from earliest|latest|offset:N|time:ISO|-15m``
(``positions.py``) with the SDK's low-level fetcher: no group, nothing committed.
``--filter`` is applied by the broker, so only matching records travel. ``--max N``
stops after N records; ``--timeout S`` stops after S seconds without a record
(otherwise it follows the topic until Ctrl-C).

``--group G`` (:func:`consume_group`) runs a real group member: it joins, prints what it is assigned, and
commits on exit (also on Ctrl-C and when ``--max`` is reached: exactly the records printed are committed).
``--subscription S`` hands over to ``subscription.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any, BinaryIO

from sluice.cli.connect import connect
from sluice.cli.errors import UsageError
from sluice.cli.output import Printer, positive_float
from sluice.cli.positions import Start, check_not_future, parse_start

if TYPE_CHECKING:
    from sluice.client.client import Client

SUBSCRIPTION_TYPES = ("exclusive", "shared", "failover", "key_shared")
# One long-poll round: the broker answers as soon as records arrive, so this only
# bounds how late an idle --timeout or Ctrl-C is noticed.
MAX_WAIT_MS = 500
# One poll's wait with --group: bounds how late an idle --timeout or Ctrl-C is noticed.
POLL_WAIT = 0.5


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "consume",
        help="print a topic's records, one line each",
        parents=[common],
        description="Print records, one per line: the value (default) or a JSON object (--format json).",
    )
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument(
        "--from",
        dest="start",
        type=parse_start,
        default=Start("latest"),
        metavar="earliest|latest|offset:N|time:ISO|-15m",
        help="where to start in each partition (default: latest, i.e. only new records); -15m: the "
        "first record of the last 15 minutes. With --group: earliest or latest, for partitions without "
        "a committed offset",
    )
    p.add_argument("--filter", metavar="EXPR", help="tag filter: '*', 'tagA' or 'tagA || tagB'")
    p.add_argument(
        "--filter-sql",
        metavar="SQL",
        help="SQL92 property filter on record headers, e.g. \"region = 'eu' AND prio > 5\" (docs/filters.md)",
    )
    p.add_argument("--max", "-n", type=_positive, metavar="N", help="stop after N records")
    p.add_argument("--format", "-f", choices=("value", "json"), default="value", help="output format")
    p.add_argument(
        "--timeout", type=positive_float, metavar="SECONDS", help="stop after this long without a record"
    )
    p.add_argument(
        "--partition", "-p", type=int, action="append", metavar="P", help="read only partition P (repeatable)"
    )
    group = p.add_argument_group("consumer groups and push subscriptions")
    group.add_argument("--group", "-g", metavar="G", help="consume as a member of pull group G")
    group.add_argument("--subscription", "-s", metavar="S", help="consume from push subscription S")
    group.add_argument("--type", choices=SUBSCRIPTION_TYPES, default="exclusive", help="subscription type")
    group.add_argument(
        "--receiver-queue", type=int, metavar="N", help="push receiver queue size (0: zero-queue)"
    )
    p.set_defaults(run=run, parser=p)


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    # Here, not at the top: the filter grammar (lark) is only for `consume`, not for every `sluice` command.
    from sluice.codec.filter import parse_filter, sql_expression

    if args.group is not None and args.subscription is not None:
        raise UsageError("--group and --subscription cannot be used together")
    if getattr(args, "filter_sql", None) is not None:
        if args.filter is not None:
            raise UsageError("--filter and --filter-sql cannot be used together")
        args.filter = sql_expression(args.filter_sql)
    # Parse locally first: a bad expression is reported before any connection.
    if args.filter is not None:
        parse_filter(args.filter)
    if args.group is not None:
        return consume_group(args, sys.stdout.buffer)
    if args.subscription is not None:
        from sluice.cli.subscription import consume_subscription

        if args.start.kind not in ("earliest", "latest"):
            raise UsageError(
                f"--from {args.start} cannot be used with --subscription: a subscription starts from its "
                "cursor (--from earliest|latest applies when it is created)"
            )

        return consume_subscription(args, sys.stdout.buffer)
    return consume_partitions(args, sys.stdout.buffer)


def consume_partitions(args: argparse.Namespace, out: BinaryIO) -> int:
    printer = Printer(out, args.format, args.max)
    with connect(args) as client:
        starts = start_offsets(client, args.topic, args.start, args.partition)
        positions = {(args.topic, partition): offset for partition, offset in starts.items()}
        filters = {args.topic: args.filter} if args.filter is not None else None
        # Records deleted by retention under a running consume: go on from the new log start.
        with client.fetcher(
            positions, filters=filters, max_wait_ms=MAX_WAIT_MS, auto_offset_reset="earliest"
        ) as fetcher:
            idle_since = time.monotonic()
            while not printer.done:
                wait = None
                if args.timeout is not None:
                    wait = args.timeout - (time.monotonic() - idle_since)
                    if wait <= 0:
                        break
                records = fetcher.fetch(timeout=wait)
                if records:
                    printer.write(records)
                    idle_since = time.monotonic()
    return 0


def start_offsets(client: Client, topic: str, start: Start, partitions: list[int] | None) -> dict[int, int]:
    """{partition: first offset to read} for ``--from``. An ``offset:N`` outside a partition's log is
    clamped into it (said on stderr), as ``group reset-offsets`` does; a time is looked up by the
    brokers (the first record at or after it, the log end if none)."""
    if start.kind in ("earliest", "latest"):
        return client.list_offsets(topic, start.kind, partitions=partitions)
    if start.kind == "time":
        check_not_future(start.value, "--from time:")
        return client.list_offsets(topic, start.value, partitions=partitions)
    first = client.list_offsets(topic, "earliest", partitions=partitions)
    end = client.list_offsets(topic, "latest", partitions=partitions)
    out = {}
    for partition in sorted(first):
        offset = min(max(start.value, first[partition]), end[partition])
        if offset != start.value:
            bound = "log start" if offset == first[partition] and start.value < offset else "log end"
            print(
                f"note: {topic}[{partition}]: offset {start.value} is outside the log "
                f"[{first[partition]}, {end[partition]}]; starting at the {bound}, {offset}",
                file=sys.stderr,
            )
        out[partition] = offset
    return out


# ---- consume --group ----------------------------------------------------------------------------------


def consume_group(args: argparse.Namespace, out: BinaryIO) -> int:
    """``sluice consume TOPIC --group G``: print records as a member of G; commit on exit."""
    if getattr(args, "partition", None):
        raise UsageError("--partition cannot be used with --group: the group assigns the partitions")
    if args.start.kind not in ("earliest", "latest"):
        raise UsageError(
            f"--from {args.start} cannot be used with --group: a group starts from its committed offsets "
            "(--from earliest|latest applies where it has none); move them first with "
            "'sluice group reset-offsets'"
        )
    printer = Printer(out, args.format, args.max)
    with connect(args) as client:
        consumer = client.consumer(
            args.group,
            {args.topic: args.filter if args.filter is not None else "*"},
            auto_offset_reset=args.start.kind,
        )
        try:
            idle_since = time.monotonic()
            while not printer.done:
                wait = POLL_WAIT
                if args.timeout is not None:
                    left = args.timeout - (time.monotonic() - idle_since)
                    if left <= 0:
                        break
                    wait = min(wait, left)
                limit = None if args.max is None else args.max - printer.count
                # Never take more than --max still allows: what poll returns counts as consumed.
                records = consumer.poll(wait, max_records=limit)
                if records:
                    printer.write(records)
                    idle_since = time.monotonic()
        finally:
            consumer.close()  # commits what was printed, then leaves the group
    return 0
