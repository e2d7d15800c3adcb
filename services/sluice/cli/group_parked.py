"""``sluice group parked G`` / ``sluice group unpark G KEY``: the poison keys parked by a pull group's
consumers (``park_poison_keys=True``; docs/poison-keys.md, "Pull consumers").

Both read ``PARK.<group>`` from its start and replay it (``ParkBook``), as a consumer does; ``unpark``
appends an ``unpark`` event, which the group's consumers read within a second (they replay the topic's
tail once a second) and then hand the key's head out again, counted from 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

from sluice.cli.connect import connect
from sluice.cli.output import bytes_to_json
from sluice.cli.subscription_admin import parse_key
from sluice.errors import InvalidArgument, RequestTimedOut
from sluice.retry.parkbook import ParkBook, ParkedKey, park_topic

__all__ = ["add_parsers"]


def add_parsers(actions: Any, common: argparse.ArgumentParser, add_format: Any) -> None:
    parked = actions.add_parser(
        "parked", help="list the keys a pull group parked, oldest first", parents=[common]
    )
    parked.add_argument("group", metavar="G")
    add_format(parked)
    parked.set_defaults(run=run_parked, parser=parked)

    unpark = actions.add_parser(
        "unpark", help="release a parked key: its records are tried again, counted from 0", parents=[common]
    )
    unpark.add_argument("group", metavar="G")
    unpark.add_argument("key", metavar="KEY", help="the key (UTF-8, or hex:00ff for raw bytes)")
    unpark.add_argument("--topic", help="only the key's parking on this topic")
    unpark.add_argument("--partition", type=int, help="only on this partition (with --topic)")
    unpark.set_defaults(run=run_unpark, parser=unpark)


def _replay(client: Any, group: str, timeout: float = 30.0) -> ParkBook:
    topic = park_topic(group)
    client.admin.describe_topic(topic)  # UnknownTopicOrPartition: the group never parked a key
    end = client.list_offsets(topic, "latest", [0])[0]
    book = ParkBook()
    deadline = time.monotonic() + timeout
    with client.fetcher({(topic, 0): 0}, max_wait_ms=100) as f:
        while f.positions()[(topic, 0)] < end:
            if time.monotonic() > deadline:
                raise RequestTimedOut(f"reading {topic} up to {end} took over {timeout:.0f}s")
            for event in f.fetch(0.5):
                book.apply(event)
    return book


def _state(pk: ParkedKey, now_ms: int) -> str:
    if pk.count > 0 and pk.due_ms == 0:
        return "held"
    return "waiting" if pk.due_ms > now_ms else "due"


def run_parked(args: argparse.Namespace) -> int:
    with connect(args) as client:
        keys = _replay(client, args.group).oldest_first()
    now = int(time.time() * 1000)
    rows = [
        {
            "topic": pk.tp[0],
            "partition": pk.tp[1],
            "key": bytes_to_json(pk.key),
            "state": _state(pk, now),
            "waiting": len(pk.pending),
            "head_offset": pk.pending[0].offset,
            "failures": pk.count,
            "age_seconds": round((now - pk.since_ms) / 1000, 3),
            "since": datetime.fromtimestamp(pk.since_ms / 1000, UTC).isoformat(timespec="milliseconds"),
        }
        for pk in keys
    ]
    if args.format == "json":
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    print(f"{'PARTITION':<30} {'KEY':<24} {'STATE':<8} {'WAITING':>8} {'HEAD':>8} {'FAILURES':>8} {'AGE':>8}")
    for r in rows:
        key = r["key"] if isinstance(r["key"], str) else json.dumps(r["key"])
        print(
            f"{r['topic']}/{r['partition']:<{max(29 - len(str(r['topic'])), 1)}} {key:<24} {r['state']:<8} "
            f"{r['waiting']:>8} {r['head_offset']:>8} {r['failures']:>8} {r['age_seconds']:>7.1f}s"
        )
    return 0


def run_unpark(args: argparse.Namespace) -> int:
    from sluice.client.consumer.parker import unpark_event

    key = parse_key(args.key)
    if args.partition is not None and not args.topic:
        raise InvalidArgument("--partition needs --topic")
    with connect(args) as client:
        book = _replay(client, args.group)
        matches = [
            pk.tp
            for pk in book.keys.values()
            if pk.key == key
            and (not args.topic or pk.tp[0] == args.topic)
            and (args.partition is None or pk.tp[1] == args.partition)
        ]
        if not matches:
            raise InvalidArgument(f"key {args.key!r} is not parked in group {args.group!r}")
        with client.producer(park_topic(args.group)) as producer:
            for k, value, tag, headers in unpark_event(key, matches):
                producer.send(value, key=k, tag=tag, headers=headers, partition=0).result(10)
    print(f"unparked {args.key} on {', '.join(f'{t}/{p}' for t, p in matches)}")
    return 0
