"""Push subscriptions on the command line.

* ``sluice consume TOPIC --subscription S --type T [--receiver-queue N]``: handled by
  :func:`consume_subscription` (``consume.py`` hands over when ``--subscription`` is
  given). Prints each message like the pull path, then acks it: a batch of messages
  is written and flushed first, acked after, so a message is acked only once it
  reached stdout. ``--max N`` stops after N (the rest stays unacked and goes to the
  subscription's other consumers); ``--timeout S`` stops after S idle seconds.
* ``sluice subscription list [TOPIC]`` and ``sluice subscription describe TOPIC S``:
  what the dispatchers report (type, consumers, backlog, last active; per consumer:
  permits, unacked, blocked, active partitions). Durable subscriptions are listed
  until deleted, idle or not.
* ``reset``, ``skip``, ``delete`` and ``peek``: ``subscription_admin.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, BinaryIO

from sluice.cli.connect import connect
from sluice.cli.output import bytes_to_json
from sluice.cli.subscription_admin import add_actions

if TYPE_CHECKING:  # the SDK pulls in gRPC, which `sluice up` and `--help` do not need
    from sluice.client.push import Message

# How long one wait for a message lasts: bounds how late an idle --timeout is noticed.
RECEIVE_SLICE = 0.5
# Messages written (and flushed) together before they are acked.
PRINT_BATCH = 500


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    sub = subparsers.add_parser(
        "subscription",
        help="push subscriptions: list, describe, reset, skip, delete, peek, parked, unpark",
        parents=[common],
    )
    actions = sub.add_subparsers(dest="action", metavar="ACTION", required=True)
    lst = actions.add_parser("list", help="subscriptions with type, consumers and backlog", parents=[common])
    lst.add_argument("topic", nargs="?", metavar="TOPIC", help="only this topic's subscriptions")
    _add_format(lst)
    lst.set_defaults(run=run_list, parser=lst)
    describe = actions.add_parser(
        "describe", help="consumers: permits, unacked, blocked, active partitions", parents=[common]
    )
    describe.add_argument("topic", metavar="TOPIC")
    describe.add_argument("subscription", metavar="SUBSCRIPTION")
    _add_format(describe)
    describe.set_defaults(run=run_describe, parser=describe)
    add_actions(actions, common)


def _add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", "-f", choices=("text", "json"), default="text", help="output format")


# ---- consume --------------------------------------------------------------------------------


def message_to_dict(msg: Message) -> dict[str, Any]:
    return {
        "topic": msg.topic,
        "partition": msg.partition,
        "offset": msg.offset,
        "timestamp": msg.timestamp,
        "key": bytes_to_json(msg.key),
        "tag": msg.tag,
        "headers": {name: bytes_to_json(value) for name, value in msg.headers.items()},
        "value": bytes_to_json(msg.value),
        "redelivery_count": msg.redelivery_count,
    }


def format_message(msg: Message, fmt: str) -> bytes:
    if fmt == "json":
        return json.dumps(message_to_dict(msg), ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    return msg.value + b"\n"


def consume_subscription(args: argparse.Namespace, out: BinaryIO) -> int:
    """``sluice consume TOPIC --subscription S``: print and ack until --max, --timeout or Ctrl-C."""
    overrides: dict[str, Any] = {"initial_position": args.start.kind}
    if args.receiver_queue is not None:
        overrides["receiver_queue_size"] = args.receiver_queue
    if args.filter is not None:
        overrides["filter"] = args.filter
    limit: int | None = args.max
    printed = 0
    with (
        connect(args) as client,
        client.push_consumer(args.topic, args.subscription, args.type, **overrides) as pc,
    ):
        idle = 0.0
        while limit is None or printed < limit:
            wait = RECEIVE_SLICE if args.timeout is None else min(RECEIVE_SLICE, args.timeout - idle)
            try:
                batch = [pc.receive(timeout=max(wait, 0.0))]
            except TimeoutError:
                idle += wait
                if args.timeout is not None and idle >= args.timeout:
                    break
                continue
            idle = 0.0
            # Whatever else is already queued goes out in the same write.
            while len(batch) < PRINT_BATCH and (limit is None or printed + len(batch) < limit):
                try:
                    batch.append(pc.receive(timeout=0))
                except TimeoutError:
                    break
            out.write(b"".join(format_message(m, args.format) for m in batch))
            out.flush()
            for m in batch:
                pc.ack(m)
            printed += len(batch)
    return 0


# ---- list / describe ---------------------------------------------------------------------------


def _iso(ms: int) -> str | None:
    """A wall-clock time in ms as ISO 8601 UTC (None when unknown)."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds") if ms else None


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def run_list(args: argparse.Namespace) -> int:
    with connect(args) as client:
        subs = client.list_subscriptions(args.topic)
    if args.format == "json":
        doc = [
            {
                "topic": s.topic,
                "subscription": s.subscription,
                "type": s.type,
                "consumers": s.consumers,
                "backlog": s.backlog,
                "durable": s.durable,
                "last_active": _iso(s.last_active_ms),
                "filter": s.filter,
                "dispatchers": list(s.dispatchers),
            }
            for s in subs
        ]
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    rows: list[tuple[str, ...]] = [
        ("TOPIC", "SUBSCRIPTION", "TYPE", "CONSUMERS", "BACKLOG", "LAST ACTIVE", "DISPATCHERS")
    ]
    rows += [
        (
            s.topic,
            s.subscription,
            s.type,
            str(s.consumers),
            str(s.backlog),
            _iso(s.last_active_ms) or "-",
            ",".join(s.dispatchers),
        )
        for s in subs
    ]
    _print_table(rows)
    return 0


def run_describe(args: argparse.Namespace) -> int:
    with connect(args) as client:
        info = client.describe_subscription(args.topic, args.subscription)
    if args.format == "json":
        doc = {
            "topic": info.topic,
            "subscription": info.subscription,
            "type": info.type,
            "backlog": info.backlog,
            "durable": info.durable,
            "last_active": _iso(info.last_active_ms),
            "filter": info.filter,
            "dispatchers": list(info.dispatchers),
            "consumers": [
                {
                    "dispatcher": c.dispatcher_id,
                    "consumer_id": c.consumer_id,
                    "consumer_name": c.consumer_name,
                    "permits": c.permits,
                    "unacked": c.unacked,
                    "blocked": c.blocked,
                    "active_partitions": list(c.active_partitions),
                }
                for c in info.consumer_details
            ],
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    print(f"Subscription: {info.topic}/{info.subscription}")
    print(f"Type:         {info.type}")
    print(f"Backlog:      {info.backlog}")
    print(f"Durable:      {'yes' if info.durable else 'no'}")
    print(f"Last active:  {_iso(info.last_active_ms) or '-'}")
    print(f"Dispatchers:  {', '.join(info.dispatchers)}")
    print(f"Consumers:    {len(info.consumer_details)}")
    if info.consumer_details:
        rows: list[tuple[str, ...]] = [
            ("NAME", "CONSUMER ID", "DISPATCHER", "PERMITS", "UNACKED", "BLOCKED", "ACTIVE")
        ]
        rows += [
            (
                c.consumer_name,
                c.consumer_id,
                c.dispatcher_id,
                str(c.permits),
                str(c.unacked),
                "yes" if c.blocked else "no",
                ",".join(str(p) for p in c.active_partitions) or "-",
            )
            for c in info.consumer_details
        ]
        _print_table(rows)
    return 0
