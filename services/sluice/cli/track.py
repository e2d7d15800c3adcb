"""``sluice track TOPIC PARTITION OFFSET --group G``: has group G consumed this message?

RocketMQ's dashboard answered this from one committed offset and one filter per
group, so in seed 004 it called messages CONSUMED that nobody processed. Here the
answer is computed per offset *track* of the group (``default``, plus one per
extra filter when the group's conflict policy is ``split``), from:

* the real record, fetched from its broker (its tag);
* the group's live members and the filter each reads the topic with (DescribeGroup);
* the committed offset of the partition on that track (the offset store).

States, per track:

=========================  ==============================================================
``NOT_ONLINE``             no live member of the group reads the topic with this track
``NOT_CONSUME_YET``        offset >= the committed offset (or nothing committed)
``CONSUMED``               offset < committed, and the record's tag matches the filter
``CONSUMED_BUT_FILTERED``  offset < committed, but the filter excludes the record's tag:
                           the group moved past it without processing it
=========================  ==============================================================
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sluice.cli.connect import connect
from sluice.codec.batch import Record
from sluice.codec.filter import parse_filter
from sluice.errors import OffsetOutOfRange

if TYPE_CHECKING:
    from sluice.client.client import Client

NOT_ONLINE = "NOT_ONLINE"
NOT_CONSUME_YET = "NOT_CONSUME_YET"
CONSUMED = "CONSUMED"
CONSUMED_BUT_FILTERED = "CONSUMED_BUT_FILTERED"
DEFAULT_TRACK = "default"


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "track",
        help="has group G consumed a message? (per offset track)",
        parents=[common],
        description="Print the message's tag, then one line per offset track of the group: "
        "NOT_ONLINE, NOT_CONSUME_YET, CONSUMED or CONSUMED_BUT_FILTERED.",
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
    #: The filter the track's live members read the topic with (None: no live member).
    filter: str | None
    #: The committed offset of the partition on the track (None: nothing committed).
    committed: int | None
    state: str


def track_state(offset: int, tag: str | None, filter_expr: str | None, committed: int | None) -> str:
    """The state of the record at ``offset`` (with ``tag``) on one track. Pure."""
    if filter_expr is None:
        return NOT_ONLINE
    if committed is None or offset >= committed:
        return NOT_CONSUME_YET
    return CONSUMED if parse_filter(filter_expr).matches(tag) else CONSUMED_BUT_FILTERED


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
    """The record and its state on every track of ``group`` that reads (or read) ``topic``."""
    record = fetch_record(client, topic, partition, offset)
    description = client.admin.describe_group(group)
    live = description.filters(topic)  # track -> filter of its live members
    readers = [m for m in description.members if topic in m.subscription]
    if readers and not live:
        # Members read the topic but hold no partition yet: with one filter that is the default track.
        filters = {m.subscription[topic] for m in readers}
        if len(filters) == 1:
            live = {DEFAULT_TRACK: filters.pop()}
    tracks = sorted({DEFAULT_TRACK, *live}, key=lambda t: (t != DEFAULT_TRACK, t))
    states = []
    for name in tracks:
        committed = client.admin.group_offsets(group, [(topic, partition)], track=name).get(
            (topic, partition)
        )
        filter_expr = live.get(name)
        states.append(
            TrackState(name, filter_expr, committed, track_state(offset, record.tag, filter_expr, committed))
        )
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
                {"track": s.track, "filter": s.filter, "committed": s.committed, "state": s.state}
                for s in states
            ],
        }
        sys.stdout.write(json.dumps(doc) + "\n")
        return 0
    print(f"{args.topic}[{args.partition}] offset {args.offset} tag={record.tag or '-'} group={args.group}")
    rows = [("TRACK", "FILTER", "COMMITTED", "STATE")]
    for s in states:
        rows.append(
            (
                s.track,
                s.filter if s.filter is not None else "-",
                "-" if s.committed is None else str(s.committed),
                s.state,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0
