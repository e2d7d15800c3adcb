"""produce's delivery accounting (with the SDK's real send futures) and consume's printer."""

from __future__ import annotations

import io

from sluice.cli.output import Printer
from sluice.cli.produce import DeliveryTracker, split_line
from sluice.client.producer.futures import BatchResult, FutureRecordMetadata
from sluice.codec.batch import Record
from sluice.errors import UnknownTopicOrPartition


def test_split_line() -> None:
    assert split_line(b"k:v:w", b":") == (b"k", b"v:w")
    assert split_line(b"no-separator", b":") == (None, b"no-separator")
    assert split_line(b"k:v", None) == (None, b"k:v")
    assert split_line(b":v", b":") == (b"", b"v")


def test_tracker_counts_acks_and_failures_exactly() -> None:
    ok, bad = BatchResult("t", 0), BatchResult("t", 1)
    tracker = DeliveryTracker()
    for i in range(3):
        tracker.add(FutureRecordMetadata(ok, i, 0))
    for i in range(2):
        tracker.add(FutureRecordMetadata(bad, i, 0))

    tracker.settle()  # nothing finished yet: nothing counted, nothing blocks
    assert (tracker.sent, tracker.acked, tracker.failed) == (5, 0, 0)

    ok.complete(10, 0, None)
    tracker.settle()  # the head is done, the tail is not
    assert (tracker.acked, tracker.failed) == (3, 0)

    bad.complete(-1, -1, UnknownTopicOrPartition("topic 't' does not exist"))
    tracker.settle(wait=True)
    assert (tracker.acked, tracker.failed) == (3, 2)
    assert isinstance(tracker.first_error, UnknownTopicOrPartition)


def record(offset: int) -> Record:
    return Record("t", 0, offset, None, f"v{offset}".encode(), None, {}, 0)


def test_printer_stops_at_max_mid_batch() -> None:
    out = io.BytesIO()
    printer = Printer(out, "value", limit=3)
    printer.write([record(0), record(1)])
    assert not printer.done
    printer.write([record(2), record(3), record(4)])
    assert printer.done
    assert out.getvalue() == b"v0\nv1\nv2\n"


def test_printer_without_limit_prints_everything() -> None:
    out = io.BytesIO()
    printer = Printer(out, "value", limit=None)
    printer.write([record(i) for i in range(5)])
    assert not printer.done
    assert printer.count == 5
    assert out.getvalue().count(b"\n") == 5
