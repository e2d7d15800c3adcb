"""``sluice subscription reset|skip|delete|peek|parked|unpark``: changing push subscriptions, looking ahead,
and the keys parked by Key_Shared poison isolation (docs/poison-keys.md).

Same shape as ``subscription describe TOPIC SUBSCRIPTION`` (a subscription belongs to its topic), and
the same ``--format text|json``. Changes refuse (``SUBSCRIPTION_IN_USE``) while consumers are connected;
``--force`` disconnects them. Everything goes through ``client.admin`` (docs/dispatcher.md,
"Subscription admin").
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sluice.cli.connect import connect
from sluice.cli.output import bytes_to_json
from sluice.errors import InvalidArgument

if TYPE_CHECKING:
    from sluice.client.push.sub_admin import PeekedMessage, SubscriptionChange

__all__ = ["add_actions"]


def add_actions(actions: Any, common: argparse.ArgumentParser) -> None:
    reset = _action(
        actions, common, "reset", "move a durable subscription to earliest, latest, a time or an offset"
    )
    reset.add_argument(
        "--to",
        required=True,
        metavar="POSITION",
        help="earliest, latest, an offset (clamped to the log), or an ISO 8601 time (no zone: UTC)",
    )
    reset.add_argument(
        "--partition", "-p", type=int, action="append", metavar="P", help="only this partition (repeatable)"
    )
    _add_force(reset, "disconnect connected consumers (they reconnect at the new position)")
    reset.set_defaults(run=run_reset)

    skip = _action(actions, common, "skip", "acknowledge the next N messages (those peek -n N shows)")
    skip.add_argument("--count", "-n", type=int, required=True, metavar="N")
    _add_force(skip, "disconnect connected consumers (they reconnect after the skipped messages)")
    skip.set_defaults(run=run_skip)

    delete = _action(actions, common, "delete", "delete a subscription and its stored positions")
    _add_force(delete, "disconnect connected consumers (their streams end with UNKNOWN_SUBSCRIPTION)")
    delete.set_defaults(run=run_delete)

    peek = _action(actions, common, "peek", "show the next messages without consuming or moving anything")
    peek.add_argument("-n", "--count", type=int, default=1, metavar="N", help="how many (default 1)")
    peek.set_defaults(run=run_peek)

    parked = _action(actions, common, "parked", "list the Key_Shared keys parked after repeated failures")
    parked.set_defaults(run=run_parked)
    unpark = _action(actions, common, "unpark", "release a parked key: its messages go again, counted from 0")
    unpark.add_argument("key", metavar="KEY", help="the key (UTF-8, or hex:00ff for raw bytes)")
    unpark.set_defaults(run=run_unpark)


def _action(actions: Any, common: argparse.ArgumentParser, name: str, text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = actions.add_parser(name, help=text, parents=[common])
    parser.add_argument("topic", metavar="TOPIC")
    parser.add_argument("subscription", metavar="SUBSCRIPTION")
    parser.add_argument("--format", "-f", choices=("text", "json"), default="text", help="output format")
    parser.set_defaults(parser=parser)
    return parser


def _add_force(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--force", action="store_true", help=text)


def change_to_dict(change: SubscriptionChange, action: str) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "topic": change.topic,
        "subscription": change.subscription,
        "action": action,
        "disconnected": change.disconnected,
    }
    if action == "delete":
        doc["partitions"] = [p.partition for p in change.partitions]
        return doc
    doc["partitions"] = [
        {"partition": p.partition, "before": p.before, "after": p.after, "note": p.note or None}
        for p in change.partitions
    ]
    if action == "skip":
        doc["skipped"] = [{"partition": p, "offset": o} for p, o in change.skipped]
    return doc


def _print_change(args: argparse.Namespace, change: SubscriptionChange, action: str) -> int:
    if args.format == "json":
        sys.stdout.write(json.dumps(change_to_dict(change, action), indent=2) + "\n")
        return 0
    name = f"{change.topic}/{change.subscription}"
    if action == "delete":
        print(f"Deleted subscription {name}.")
    elif action == "skip":
        print(f"Skipped {len(change.skipped)} message(s) of {name}.")
    else:
        print(f"Reset subscription {name}.")
    if action != "delete":
        for p in change.partitions:
            before = "-" if p.before < 0 else str(p.before)
            note = f"  ({p.note})" if p.note else ""
            print(f"  partition {p.partition}: {before} -> {p.after}{note}")
    if change.disconnected:
        print(f"Disconnected {change.disconnected} consumer(s).")
    return 0


def run_reset(args: argparse.Namespace) -> int:
    with connect(args) as client:
        change = client.admin.reset_subscription(
            args.topic, args.subscription, args.to, partitions=args.partition, force=args.force
        )
    return _print_change(args, change, "reset")


def run_skip(args: argparse.Namespace) -> int:
    with connect(args) as client:
        change = client.admin.skip_subscription(args.topic, args.subscription, args.count, force=args.force)
    return _print_change(args, change, "skip")


def run_delete(args: argparse.Namespace) -> int:
    with connect(args) as client:
        change = client.admin.delete_subscription(args.topic, args.subscription, force=args.force)
    return _print_change(args, change, "delete")


def peeked_to_dict(m: PeekedMessage) -> dict[str, Any]:
    return {
        "topic": m.topic,
        "partition": m.partition,
        "offset": m.offset,
        "timestamp": m.timestamp,
        "key": bytes_to_json(m.key),
        "tag": m.tag,
        "headers": {name: bytes_to_json(value) for name, value in m.headers.items()},
        "value": bytes_to_json(m.value),
        "redelivery_count": m.redelivery_count,
    }


def run_peek(args: argparse.Namespace) -> int:
    with connect(args) as client:
        messages = client.admin.peek_subscription(args.topic, args.subscription, args.count)
    if args.format == "json":
        sys.stdout.write(json.dumps([peeked_to_dict(m) for m in messages], indent=2) + "\n")
        return 0
    for m in messages:
        when = datetime.fromtimestamp(m.timestamp / 1000, UTC).isoformat(timespec="milliseconds")
        value = bytes_to_json(m.value)
        shown = value if isinstance(value, str) else json.dumps(value)
        print(f"{m.partition}/{m.offset}  {when}  redeliveries={m.redelivery_count}  {shown}")
    return 0


def parse_key(text: str) -> bytes:
    """``hex:...`` for raw bytes, else the UTF-8 text."""
    if text.startswith("hex:"):
        try:
            return bytes.fromhex(text[4:])
        except ValueError:
            raise InvalidArgument(f"KEY {text!r}: not hexadecimal after 'hex:'") from None
    return text.encode()


def run_parked(args: argparse.Namespace) -> int:
    with connect(args) as client:
        keys = client.admin.list_parked_keys(args.topic, args.subscription)
    now = datetime.now(UTC)
    if args.format == "json":
        doc = [
            {
                "key": bytes_to_json(k.key),
                "state": k.state,
                "since": k.since.isoformat(timespec="milliseconds"),
                "age_seconds": round((now - k.since).total_seconds(), 3),
                "head": {"partition": k.head_partition, "offset": k.head_offset},
                "head_redelivery_count": k.head_redelivery_count,
                "waiting": k.waiting,
                "dispatcher": k.dispatcher_id,
            }
            for k in keys
        ]
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    if not keys:
        print(f"No parked key in {args.topic}/{args.subscription}.")
    for k in keys:
        shown = bytes_to_json(k.key)
        age = (now - k.since).total_seconds()
        print(
            f"{shown if isinstance(shown, str) else json.dumps(shown)}  {k.state}  age={age:.1f}s  "
            f"head={k.head_partition}/{k.head_offset} (redeliveries={k.head_redelivery_count})  "
            f"waiting={k.waiting}"
        )
    return 0


def run_unpark(args: argparse.Namespace) -> int:
    key = parse_key(args.key)
    with connect(args) as client:
        released = client.admin.unpark_key(args.topic, args.subscription, key)
    print(f"Unparked {args.key!r} in {args.topic}/{args.subscription}: {released} message(s) go again.")
    return 0
