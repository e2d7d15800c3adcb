"""``sluice track TOPIC PARTITION OFFSET --group G``: has group G consumed this message?

RocketMQ's dashboard answered this from one committed offset and one filter per
group, so in seed 004 it called messages CONSUMED that nobody processed. Here the
answer is computed per offset *track* of the group (``default``, plus one per
extra filter when the group's conflict policy is ``split``), from:

* the real record, fetched from its broker (its tag);
* the group's bindings (DescribeGroup): which filter reads the topic on each track,
  whether any member does now, and the handover that gave the track its start
  position (the filter it took the position from, and the offset it started at);
* the committed offset of the partition on that track (the offset store).

States, per track:

============================  ===========================================================
``NOT_ONLINE``                no filter is bound to the track for this topic (never read,
                              or its offsets expired)
``NOT_CONSUME_YET``           offset >= the committed offset (or nothing committed)
``CONSUMED``                  offset < committed, and the record's tag matches the filter
``CONSUMED_BUT_FILTERED``     offset < committed, but the filter excludes the record's tag:
                              the group moved past it without processing it
``SKIPPED_AT_HANDOVER``       the filter matches, but the track started past the record:
                              it inherited the position of a filter that excluded it, so
                              no member of this filter ever received it
``CONSUMED_BEFORE_HANDOVER``  the track started past the record, which the filter it took
                              the position from did match: consumed under that filter
============================  ===========================================================

A binding nobody reads now still answers (``members`` 0): its committed offset says
what a member returning with the filter will and will not receive.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sluice.cli.connect import connect
from sluice.codec.batch import Headers, Record
from sluice.codec.filter import parse_filter
from sluice.errors import OffsetOutOfRange

if TYPE_CHECKING:
    from sluice.client.client import Client

NOT_ONLINE = "NOT_ONLINE"
NOT_CONSUME_YET = "NOT_CONSUME_YET"
CONSUMED = "CONSUMED"
CONSUMED_BUT_FILTERED = "CONSUMED_BUT_FILTERED"
SKIPPED_AT_HANDOVER = "SKIPPED_AT_HANDOVER"
CONSUMED_BEFORE_HANDOVER = "CONSUMED_BEFORE_HANDOVER"
DEFAULT_TRACK = "default"


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "track",
        help="has group G consumed a message? (per offset track)",
        parents=[common],
        description="Print the message's tag, then one line per offset track of the group: "
        "NOT_ONLINE, NOT_CONSUME_YET, CONSUMED, CONSUMED_BUT_FILTERED, SKIPPED_AT_HANDOVER or "
        "CONSUMED_BEFORE_HANDOVER.",
    )
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("partition", type=int, metavar="PARTITION")
    p.add_argument("offset", type=int, metavar="OFFSET")
    p.add_argument("--group", "-g", required=True, metavar="G")
    p.add_argument("--format", "-f", choices=("text", "json"), default="text", help="output format")
    p.set_defaults(run=run, parser=p)


@dataclass(frozen=True)
class TrackState:
    track: str
    #: The filter bound to the track for the topic (None: none is).
    filter: str | None
    #: The committed offset of the partition on the track (None: nothing committed).
    committed: int | None
    state: str
    #: Members reading the topic with the filter now (0: the binding is idle).
    members: int = 0
    #: The filter whose position the track took at its handover ("" none), and the offset it started at.
    inherited_filter: str = ""
    handover_offset: int | None = None


def track_state(
    offset: int,
    tag: str | None,
    filter_expr: str | None,
    committed: int | None,
    handover_offset: int | None = None,
    inherited_filter: str = "",
    headers: Headers | None = None,
) -> str:
    """The state of the record at ``offset`` (with ``tag`` and ``headers``, which an SQL92 filter
    reads) on one track. Pure."""
    if filter_expr is None:
        return NOT_ONLINE
    if committed is None or offset >= committed:
        return NOT_CONSUME_YET
    if not parse_filter(filter_expr).matches(tag, headers):
        return CONSUMED_BUT_FILTERED
    if handover_offset is not None and offset < handover_offset:
        if inherited_filter and parse_filter(inherited_filter).matches(tag, headers):
            return CONSUMED_BEFORE_HANDOVER
        return SKIPPED_AT_HANDOVER
    return CONSUMED


def fetch_record(client: Client, topic: str, partition: int, offset: int) -> Record:
    """The record at ``offset``, read from its broker (OffsetOutOfRange if there is none)."""
    with client.fetcher({(topic, partition): offset}, max_wait_ms=0) as fetcher:
        for _ in range(3):  # the first answer may hold only batches that end before the offset
            for record in fetcher.fetch(timeout=2.0):
                if record.offset == offset:
                    return record
                if record.offset > offset:
                    break
    raise OffsetOutOfRange(
        f"{topic}[{partition}] has no record at offset {offset}",
        topic=topic,
        partition=partition,
        offset=offset,
    )


def track(
    client: Any, group: str, topic: str, partition: int, offset: int
) -> tuple[Record, list[TrackState]]:
    """The record and its state on every track of ``group`` bound for ``topic`` (and ``default``)."""
    record = fetch_record(client, topic, partition, offset)
    description = client.admin.describe_group(group)
    bindings = {b.track: b for b in description.tracks if b.topic == topic}
    tracks = sorted({DEFAULT_TRACK, *bindings}, key=lambda t: (t != DEFAULT_TRACK, t))
    states = []
    for name in tracks:
        committed = client.admin.group_offsets(group, [(topic, partition)], track=name).get(
            (topic, partition)
        )
        b = bindings.get(name)
        if b is None:
            states.append(TrackState(name, None, committed, NOT_ONLINE))
            continue
        started = b.handover_offsets.get(partition) if b.source_track else None
        state = track_state(
            offset, record.tag, b.filter, committed, started, b.inherited_filter, record.headers
        )
        states.append(TrackState(name, b.filter, committed, state, b.members, b.inherited_filter, started))
    return record, states


def run(args: argparse.Namespace) -> int:
    with connect(args) as client:
        record, states = track(client, args.group, args.topic, args.partition, args.offset)
    if args.format == "json":
        doc = {
            "topic": args.topic,
            "partition": args.partition,
            "offset": args.offset,
            "tag": record.tag,
            "group": args.group,
            "tracks": [
                {
                    "track": s.track,
                    "filter": s.filter,
                    "committed": s.committed,
                    "state": s.state,
                    "members": s.members,
                    "inherited_filter": s.inherited_filter or None,
                    "handover_offset": s.handover_offset,
                }
                for s in states
            ],
        }
        sys.stdout.write(json.dumps(doc) + "\n")
        return 0
    print(f"{args.topic}[{args.partition}] offset {args.offset} tag={record.tag or '-'} group={args.group}")
    rows = [("TRACK", "FILTER", "MEMBERS", "COMMITTED", "STARTED_AT", "STATE")]
    for s in states:
        started = "-"
        if s.handover_offset is not None:
            started = f"{s.handover_offset} (from {s.inherited_filter or '-'})"
        rows.append(
            (
                s.track,
                s.filter if s.filter is not None else "-",
                str(s.members),
                "-" if s.committed is None else str(s.committed),
                started,
                s.state,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0
