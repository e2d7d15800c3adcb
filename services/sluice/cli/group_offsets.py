"""``sluice group reset-offsets`` and ``sluice group delete``.

``reset-offsets`` follows Kafka's ``kafka-consumer-groups --reset-offsets``: without ``--execute`` it only
previews (per partition: the committed offset now, the new one, whether the target was clamped into the
log), and changes nothing; with ``--execute`` it applies the same plan in one atomic write. Both are
refused (GROUP_NOT_EMPTY) while the group has active members: a preview that could not be executed
would mislead. The work is the offset store's (``ResetOffsets``), through ``client.admin``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sluice.cli.connect import connect
from sluice.cli.positions import parse_datetime
from sluice.common.units import iso_ms

if TYPE_CHECKING:  # the SDK (gRPC, the consumer) loads only when a reset runs, not for `sluice --help`
    from sluice.client.consumer.offset_reset import OffsetResetRow, ResetTo

__all__ = ["add_parsers"]

_CLAMP_NOTES = {
    "log_start": "below the log start: clamped to it",
    "log_end": "past the log end: clamped to it",
}


def add_parsers(actions: Any, common: argparse.ArgumentParser, add_format: Any) -> None:
    reset = actions.add_parser(
        "reset-offsets",
        help="preview (default) or --execute a reset of a group's committed offsets (group must be empty)",
        parents=[common],
        description="Without --execute nothing changes: the plan is printed per partition.",
    )
    reset.add_argument("group", metavar="G")
    which = reset.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--topic",
        "-t",
        action="append",
        type=_topic_partitions,
        metavar="T[:P,P...]",
        help="a topic, or some of its partitions (orders:0,2); repeatable",
    )
    which.add_argument(
        "--all-topics", action="store_true", help="every topic the group has committed offsets for"
    )
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the start of each partition's log")
    to.add_argument("--to-latest", action="store_true", help="the end of each partition's log")
    to.add_argument("--to-offset", type=_non_negative, metavar="N", help="offset N (clamped into each log)")
    to.add_argument(
        "--to-datetime", type=parse_datetime, metavar="ISO", help="the first record at or after a past time"
    )
    to.add_argument("--by-duration", metavar="DURATION", help="the first record of the last DURATION (15m)")
    to.add_argument("--shift-by", type=int, metavar="N", help="the committed offset + N (negative: back)")
    reset.add_argument("--track", default="default", help="the offset track (split groups; default: default)")
    reset.add_argument("--execute", action="store_true", help="apply the reset (default: preview only)")
    add_format(reset)
    reset.set_defaults(run=run_reset, parser=reset)

    delete = actions.add_parser(
        "delete",
        help="delete a group and all its committed offsets (group must be empty)",
        parents=[common],
    )
    delete.add_argument("group", metavar="G")
    add_format(delete)
    delete.set_defaults(run=run_delete, parser=delete)


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _topic_partitions(text: str) -> tuple[str, list[int] | None]:
    """``orders`` -> all partitions; ``orders:0,2`` -> partitions 0 and 2."""
    topic, sep, parts = text.partition(":")
    if not topic:
        raise argparse.ArgumentTypeError(f"expected TOPIC or TOPIC:0,1,..., got {text!r}")
    if not sep:
        return topic, None
    try:
        partitions = [int(p) for p in parts.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected TOPIC:0,1,... with partition numbers, got {text!r}"
        ) from None
    if not partitions or any(p < 0 for p in partitions):
        raise argparse.ArgumentTypeError(f"expected TOPIC:0,1,... with partitions >= 0, got {text!r}")
    return topic, partitions


def reset_to(args: argparse.Namespace) -> ResetTo:
    from sluice.client.consumer.offset_reset import ResetTo

    if args.to_earliest:
        return ResetTo.earliest()
    if args.to_latest:
        return ResetTo.latest()
    if args.to_offset is not None:
        return ResetTo.offset(args.to_offset)
    if args.to_datetime is not None:
        return ResetTo.datetime(args.to_datetime)
    if args.by_duration is not None:
        return ResetTo.duration(args.by_duration)
    return ResetTo.shift(args.shift_by)


def _topics(args: argparse.Namespace) -> dict[str, list[int] | None] | None:
    if args.all_topics:
        return None
    topics: dict[str, list[int] | None] = {}
    for topic, partitions in args.topic:
        if topic in topics:
            old = topics[topic]
            # orders and orders:1 together: all of orders.
            topics[topic] = None if old is None or partitions is None else sorted({*old, *partitions})
        else:
            topics[topic] = partitions
    return topics


def _requested(to: ResetTo, row: OffsetResetRow) -> int | None:
    """What was asked for ``row`` before clamping (for the note), where it is a number."""
    if to.kind == "offset":
        return to.value
    if to.kind == "shift" and row.previous is not None:
        return row.previous + to.value
    return None


def row_to_dict(to: ResetTo, row: OffsetResetRow) -> dict[str, Any]:
    return {
        "topic": row.topic,
        "partition": row.partition,
        "current": row.previous,
        "new": row.offset,
        "clamped": row.clamped,
        "requested": _requested(to, row),
        "log_start_offset": row.log_start_offset,
        "log_end_offset": row.log_end_offset,
    }


def _target(to: ResetTo) -> str:
    if to.kind == "timestamp":
        return f"first record at or after {iso_ms(to.value)}"
    if to.kind in ("offset", "shift"):
        return f"{to.kind} {to.value}"
    return to.kind


def run_reset(args: argparse.Namespace) -> int:
    to = reset_to(args)
    with connect(args) as client:
        rows = client.admin.reset_group_offsets(
            args.group, to, _topics(args), track=args.track, execute=args.execute
        )
    if args.format == "json":
        doc = {
            "group": args.group,
            "track": args.track,
            "executed": args.execute,
            "to": {"kind": to.kind, "value": to.value},
            "partitions": [row_to_dict(to, r) for r in rows],
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    if args.execute:
        print(f"Reset group {args.group} (track {args.track}) to {_target(to)}:")
    else:
        print(f"Preview of a reset of group {args.group} (track {args.track}) to {_target(to)}.")
        print("Nothing changed: add --execute to apply it.")
    _print_rows(to, rows)
    return 0


def _print_rows(to: ResetTo, rows: Sequence[OffsetResetRow]) -> None:
    def num(value: int | None) -> str:
        return "-" if value is None else str(value)

    table = [("TOPIC", "PARTITION", "CURRENT", "NEW", "LOG-START", "LOG-END", "NOTE")]
    for r in rows:
        note = ""
        if r.clamped:
            asked = _requested(to, r)
            note = (f"{asked} is " if asked is not None else "") + _CLAMP_NOTES.get(r.clamped, r.clamped)
        table.append(
            (
                r.topic,
                str(r.partition),
                num(r.previous),
                str(r.offset),
                num(r.log_start_offset),
                num(r.log_end_offset),
                note,
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def run_delete(args: argparse.Namespace) -> int:
    with connect(args) as client:
        deleted = client.admin.delete_group(args.group)
    if args.format == "json":
        sys.stdout.write(
            json.dumps({"group": args.group, "deleted": True, "offsets_deleted": deleted}) + "\n"
        )
    else:
        print(f"Deleted group {args.group} ({deleted} committed offset(s)).")
    return 0
