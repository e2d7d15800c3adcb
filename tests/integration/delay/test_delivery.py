"""Delayed delivery end to end (real processes): each record once, never early, on time, in order."""

from __future__ import annotations

import random
import time
from datetime import timedelta

from tests.integration.delay.conftest import DelayCluster, collect

#: Suite size (bench/delayed_delivery.py runs 100,000 over 60 s and a 10,000 due/s run).
RECORDS = 10_000
SPREAD_MS = 10_000
PARTITIONS = 2


def _lateness_p99(late: list[int]) -> int:
    late = sorted(late)
    return late[int(len(late) * 0.99) - 1]


def test_random_delays_each_once_never_early_p99_on_time(delay_cluster: DelayCluster) -> None:
    client = delay_cluster.client()
    topic = delay_cluster.topic(PARTITIONS)
    rng = random.Random(17)
    producer = client.producer(topic)
    delays = [rng.randrange(SPREAD_MS) for _ in range(RECORDS)]
    for i, d in enumerate(delays):
        producer.send(str(i).encode(), key=str(i % 50).encode(), deliver_after=timedelta(milliseconds=d))
    producer.flush(30)
    producer.close()
    # Records due before every send was acknowledged could not all be on time (the scheduler had not
    # seen them yet): lateness is asserted over the others, which are most of them.
    acked_ms = time.time_ns() // 1_000_000
    arrivals = collect(client, topic, PARTITIONS, RECORDS, timeout=SPREAD_MS / 1000 + 40)
    values = [int(a.record.value) for a in arrivals]
    assert len(values) == RECORDS, f"{len(values)} of {RECORDS} delivered"
    assert len(set(values)) == RECORDS, "a record was delivered twice"
    early = [a for a in arrivals if a.received_ms < a.due]
    assert not early, f"{len(early)} delivered early, e.g. {early[0]}"
    timely = [a.received_ms - a.due for a in arrivals if a.due >= acked_ms]
    assert len(timely) > RECORDS * 0.7
    p99 = _lateness_p99(timely)
    overall = _lateness_p99([a.received_ms - a.due for a in arrivals])
    print(f"p99 lateness {p99} ms over {len(timely)} due after the sends' ack ({overall} ms, all)")
    # The goal is 100 ms (measured by bench/delayed_delivery.py: 19-68 ms here when the machine is quiet,
    # docs/delayed-delivery.md); the suite runs beside other work on 2 cores, so it guards the order of
    # magnitude (a scheduler that wakes on a timer instead of the due time is seconds late).
    assert p99 <= 300, f"p99 lateness {p99} ms"
    # Same due time, same target partition: delivered in send order (their schedule offsets).
    same_due = 0
    for p in range(PARTITIONS):
        by_due: dict[int, list[int]] = {}
        for a in arrivals:
            if a.record.partition == p:
                by_due.setdefault(a.due, []).append(int(a.coordinates.split(b":")[1]))
        for due, offsets in by_due.items():
            assert offsets == sorted(offsets), f"partition {p}, due {due}: not in offset order"
            same_due += len(offsets) > 1
    assert same_due > 0


def test_pending_records_hold_back_nothing(delay_cluster: DelayCluster) -> None:
    """A record due in an hour does not hold back an immediate one sent after it to the same partition,
    and its partition shows nothing of it until due (it lives in the schedule topic)."""
    client = delay_cluster.client()
    topic = delay_cluster.topic(1)
    with client.producer(topic) as producer:
        producer.send(b"later", deliver_after=timedelta(hours=1)).result(10)
        producer.send(b"now").result(10)
        producer.send(b"past", deliver_after=timedelta(seconds=-5)).result(10)
    arrivals = collect(client, topic, 1, 3, timeout=5)
    assert sorted(a.record.value for a in arrivals) == [b"now", b"past"]
    assert time.time() > 0
