"""``sluice produce TOPIC``: one message per stdin line, batched by the SDK producer.

stdin is read as bytes; each line's trailing ``\\n`` is removed (nothing else, so
a ``\\r`` or spaces are part of the value) and every line, empty ones too, is one
message. Sends are asynchronous: the producer batches them by size and linger,
and the command flushes at EOF. The first failed delivery stops reading, the rest
in flight are flushed, and the command exits 1 with the typed error.
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from datetime import datetime, timedelta
from typing import Any, BinaryIO, Protocol

from sluice.cli.connect import connect
from sluice.cli.errors import UsageError
from sluice.cli.output import collect_pairs, key_value
from sluice.common.units import parse_duration
from sluice.errors import SluiceError

# How often (in lines) the reading loop looks at finished sends: often enough to
# stop soon after a failure, rarely enough to cost nothing per line.
SETTLE_EVERY = 256


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "produce",
        help="send stdin to a topic, one message per line",
        parents=[common],
        description="Send one message per stdin line (bytes; the trailing newline is removed).",
    )
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--key", "-k", help="key for every message (UTF-8); same key, same partition")
    p.add_argument(
        "--key-separator",
        "-K",
        metavar="SEP",
        help="split each line at the first SEP into key and value (lines without SEP have no key)",
    )
    p.add_argument("--tag", "-t", help="tag for every message (what --filter matches)")
    p.add_argument(
        "--header", "-H", type=key_value, action="append", metavar="NAME=VALUE", help="header, repeatable"
    )
    p.add_argument("--partition", "-p", type=int, help="send every message to this partition")
    p.add_argument("--quiet", "-q", action="store_true", help="no summary line on stderr")
    when = p.add_mutually_exclusive_group()
    when.add_argument(
        "--deliver-after",
        type=_duration,
        metavar="DURATION",
        help="deliver every message this long from now (e.g. 30s, 2h; docs/delayed-delivery.md)",
    )
    when.add_argument(
        "--deliver-at",
        type=_instant,
        metavar="TIME",
        help="deliver every message at this ISO 8601 time with a zone (2030-01-01T09:00:00+00:00)",
    )
    p.set_defaults(run=run, parser=p)


def _duration(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except SluiceError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _instant(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(f"give a time zone (e.g. +00:00 or Z): {text!r}")
    return when


class SendFuture(Protocol):
    """The part of the SDK's send future this command reads."""

    def done(self) -> bool: ...

    def cancelled(self) -> bool: ...

    def exception(self, timeout: float | None = None) -> BaseException | None: ...


class DeliveryTracker:
    """Settles send futures in order, so the counts are exact once everything is flushed.

    Futures are kept only while in flight (the producer's buffer bounds them) and
    are read directly, not through callbacks, which may still be running on the
    producer's thread after ``flush()`` returns.
    """

    def __init__(self) -> None:
        self._pending: deque[SendFuture] = deque()
        self.sent = 0
        self.acked = 0
        self.failed = 0
        self.first_error: BaseException | None = None

    def add(self, future: SendFuture) -> None:
        self._pending.append(future)
        self.sent += 1

    def settle(self, wait: bool = False) -> None:
        """Count the finished futures at the head (all of them, waiting, when ``wait``)."""
        while self._pending and (wait or self._pending[0].done()):
            future = self._pending.popleft()
            exc = SluiceError("send cancelled") if future.cancelled() else future.exception()
            if exc is None:
                self.acked += 1
                continue
            self.failed += 1
            if self.first_error is None:
                self.first_error = exc


def split_line(line: bytes, separator: bytes | None) -> tuple[bytes | None, bytes]:
    """(key, value) of one input line, its trailing newline already removed."""
    if separator is None:
        return None, line
    key, sep, value = line.partition(separator)
    return (key, value) if sep else (None, line)


def run(args: argparse.Namespace) -> int:
    if args.key is not None and args.key_separator is not None:
        raise UsageError("--key and --key-separator cannot be used together")
    if args.key_separator == "":
        raise UsageError("--key-separator must not be empty")
    headers = {k: v.encode() for k, v in collect_pairs(args.header, "--header").items()}
    return produce(args, sys.stdin.buffer, headers)


def produce(args: argparse.Namespace, stdin: BinaryIO, headers: dict[str, bytes]) -> int:
    fixed_key = args.key.encode() if args.key is not None else None
    separator = args.key_separator.encode() if args.key_separator is not None else None
    extra: dict[str, Any] = {} if args.partition is None else {"partition": args.partition}
    if getattr(args, "deliver_after", None) is not None:
        extra["deliver_after"] = args.deliver_after
    if getattr(args, "deliver_at", None) is not None:
        extra["deliver_at"] = args.deliver_at
    tracker = DeliveryTracker()
    with connect(args) as client:
        producer = client.producer(args.topic)
        try:
            for raw in stdin:
                if tracker.sent % SETTLE_EVERY == 0:
                    tracker.settle()
                    if tracker.first_error is not None:
                        break  # fail fast: do not keep sending into an error
                line = raw[:-1] if raw.endswith(b"\n") else raw
                key, value = split_line(line, separator)
                future = producer.send(
                    value,
                    key=fixed_key if key is None else key,
                    tag=args.tag,
                    headers=headers or None,
                    **extra,
                )
                tracker.add(future)
            producer.flush()
            tracker.settle(wait=True)
        finally:
            producer.close()
    if tracker.first_error is not None:
        err = tracker.first_error
        print(
            f"error: {err}" if isinstance(err, SluiceError) else f"error: {type(err).__name__}: {err}",
            file=sys.stderr,
        )
        print(
            f"{tracker.failed} of {tracker.sent} message(s) failed; "
            f"{tracker.acked} delivered to {args.topic}",
            file=sys.stderr,
        )
        return 1
    if not args.quiet:
        print(f"produced {tracker.acked} message(s) to {args.topic}", file=sys.stderr)
    return 0
