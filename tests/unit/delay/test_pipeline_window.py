"""The window of delivery batches in flight (``broker/schedule/pipeline.py``): pure, time passed in."""

from __future__ import annotations

from sluice.broker.schedule.delivery import Sent
from sluice.broker.schedule.entry import Entry
from sluice.broker.schedule.pipeline import Flight, Window


def _flight(n: int, sent_at: int) -> Flight:
    batch = [Entry(0, 0, i, "t", 0, None, b"", None, {}, 0) for i in range(n)]
    return Flight(Sent(batch), sent_at, sent_at, sent_at)


def test_the_next_batch_goes_at_once_alone_and_only_once_late_behind_a_batch_in_flight() -> None:
    w = Window(max_batches=3, max_records=100, spacing_ms=10)
    assert w.gate(now_ms=1_000, first_due=990) == 0  # nothing in flight: send now
    w.push(_flight(5, sent_at=1_000))
    # Answers usually come in 1-2 ms: the records due meanwhile wait for it (one larger batch) ...
    assert w.gate(now_ms=1_002, first_due=1_001) == 9
    # ... unless the answer is late: then the next batch goes spacing_ms after the last send.
    assert w.gate(now_ms=1_012, first_due=1_001) == 0
    assert w.gate(now_ms=1_012, first_due=1_005) == 3  # a record due later waits spacing_ms past its due
    w.push(_flight(90, sent_at=1_012))
    assert w.room() == 5  # records bound
    w.push(_flight(5, sent_at=1_030))
    assert w.room() == 0  # batches bound
    assert w.gate(now_ms=2_000, first_due=1_020) is None  # full: until a batch is settled
    assert w.peak == 3


def test_batches_settle_in_send_order_and_a_failure_stops_sending_until_recovered() -> None:
    w = Window(max_batches=8, max_records=1_000, spacing_ms=0)
    flights = [_flight(n, sent_at=t) for t, n in enumerate((3, 4, 5))]
    for f in flights:
        w.push(f)
    assert w.head() is flights[0]
    assert w.pop() is flights[0]
    assert w.head() is flights[1]
    assert w.records == 9
    w.broken = True
    assert w.room() == 0
    assert w.gate(now_ms=100, first_due=0) is None
    assert w.take_all() == flights[1:]
    assert (len(w), w.records, w.head()) == (0, 0, None)
