"""Pipelined deliveries (docs/delayed-delivery.md, "Pipelined deliveries"), against a real broker.

The broker is paused with SIGSTOP to make its answers late, as the stalls seen in loaded runs were: the
scheduler's delivery batches keep going out behind the unanswered one, land in send order per partition,
and a crash with them in flight still finds every one of them (the recovery mark stays below them).
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest

from sluice import Client
from sluice.broker.schedule.delivery import Deliverer, Sent
from sluice.broker.schedule.entry import Entry
from sluice.broker.schedule.scheduler import _DELIVERY_CONFIG, Scheduler, SchedulerSettings
from sluice.client.producer.delay import DUE_HEADER, SCHEDULE_HEADER
from sluice.errors import SluiceError
from tests.harness import ServiceProcess
from tests.integration.delay.conftest import DelayCluster, collect

PARTITIONS = 2
PER_BATCH = 300
FAIL_RECORDS = 1_500


def _batch(topic: str, k: int, due: int) -> list[Entry]:
    """Delivery batch ``k``: PER_BATCH records over both partitions, schedule offsets rising with ``k``."""
    out = []
    for i in range(PER_BATCH):
        so = k * PER_BATCH + i
        headers = {DUE_HEADER: b"%d" % due, SCHEDULE_HEADER: b"0:%d" % so}
        out.append(Entry(due, 0, so, topic, i % PARTITIONS, None, b"v%d" % so, None, headers, due))
    return out


@contextmanager
def _paused(broker: ServiceProcess) -> Iterator[None]:
    """The broker stops answering (SIGSTOP) until the block ends: every acknowledgement is late."""
    broker.process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        broker.process.send_signal(signal.SIGCONT)


def _until(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _all_in_flight(d: Deliverer, targets: set[tuple[str, int]], n: int) -> bool:
    return all(d.in_flight(t) >= n for t in targets)


def _failed(caplog: pytest.LogCaptureFixture) -> bool:
    return any("failed" in r.getMessage() and "recovering" in r.getMessage() for r in caplog.records)


def _settle(d: Deliverer, sent: Sent) -> None:
    d.settle(sent, 30)
    d.settled(sent)


def test_batches_sent_while_an_answer_is_late_fly_together_and_land_in_send_order(
    delay_cluster: DelayCluster, tmp_path: Path
) -> None:
    client = delay_cluster.client()
    topic = delay_cluster.topic(PARTITIONS)
    targets = {(topic, p) for p in range(PARTITIONS)}
    d = Deliverer(client, tmp_path, _DELIVERY_CONFIG)
    d.prepare(targets)
    due = int(time.time() * 1000)
    try:
        with _paused(delay_cluster.broker):
            sent: list[Sent] = []
            for k in range(5):
                sent.append(d.send(_batch(topic, k, due)))
                # Each batch goes on the wire behind the unanswered ones (one more producer batch in
                # flight per partition), not after their answers.
                on_wire = _until(partial(_all_in_flight, d, targets, k + 1), 5.0)
                flying = {t: d.in_flight(t) for t in targets}
                assert on_wire, f"batch {k} not sent while the earlier ones are unanswered: {flying}"
            answered = [s.futures[0].done() for s in sent]
        assert not any(answered), "an answer came from a paused broker"
        for s in sent:
            _settle(d, s)
    finally:
        d.close(5)
    arrivals = collect(client, topic, PARTITIONS, 5 * PER_BATCH, timeout=20)
    assert len(arrivals) == 5 * PER_BATCH
    for p in range(PARTITIONS):
        sos = [int(a.coordinates.split(b":")[1]) for a in arrivals if a.record.partition == p]
        assert sos == sorted(sos), f"partition {p} not in send order"
        assert len(sos) == len(set(sos)) == 5 * PER_BATCH // PARTITIONS


def _latest(client: Client, topic: str) -> int:
    return sum(client.list_offsets(topic, "latest", list(range(PARTITIONS))).values())


def test_a_late_batch_keeps_its_recovery_mark_below_it_and_a_crash_finds_every_batch_in_flight(
    delay_cluster: DelayCluster, tmp_path: Path
) -> None:
    """Batches unanswered across several checkpoints: the recovery mark is advanced only to the end of
    what was settled (never past them, never removed), so after a crash with them in flight a restart
    finds each of their records in the topic (and dedup by coordinates does not send them again)."""
    client = delay_cluster.client()
    topic = delay_cluster.topic(PARTITIONS)
    d = Deliverer(client, tmp_path, _DELIVERY_CONFIG)
    due = int(time.time() * 1000)
    first = d.send(_batch(topic, 0, due))
    _settle(d, first)
    settled_end = {tp: o for tp, o in client.list_offsets(topic, "latest", list(range(PARTITIONS))).items()}
    with _paused(delay_cluster.broker):
        late = [d.send(_batch(topic, k, due)) for k in (1, 2, 3)]
        with pytest.raises(SluiceError):
            d.settle(late[0], 0.3)  # late: its outcome is unknown for now
        for _ in range(3):  # checkpoint periods pass with the batches still in flight
            d.end_checkpoint(d.begin_checkpoint())
        marks = {(t, p): o for t, p, o in json.loads((tmp_path / "marks.json").read_text())}
    # The process dies here (no settled(), no done marks); the requests it sent land meanwhile.
    deadline = time.monotonic() + 30
    while _latest(client, topic) < 4 * PER_BATCH and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _latest(client, topic) == 4 * PER_BATCH
    for p in range(PARTITIONS):
        assert (topic, p) in marks, "the mark of a partition with batches in flight was removed"
        assert marks[(topic, p)] <= settled_end[p], "the mark passed records not yet acknowledged"
    restarted = Deliverer(client, tmp_path, _DELIVERY_CONFIG)
    found = {(sp, so) for sp, so, _ in restarted.recover(30)}
    missing = [e.so for s in late for e in s.batch if (e.sp, e.so) not in found]
    assert not missing, f"{len(missing)} records in flight at the crash not found (would be sent twice)"
    d.close(5)


def test_a_batch_that_fails_with_others_in_flight_sends_them_all_to_recovery_none_lost_or_twice(
    delay_cluster: DelayCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An in-process scheduler with a 1 s send timeout; the broker pauses for 2.5 s while deliveries flow,
    so the oldest batch in flight fails with later ones behind it. All of them go to recovery: the
    records that landed are marked done, the others sent again; each arrives once, none early."""
    delay_cluster.kill_scheduler()  # this test's scheduler reads the schedule topic instead
    client = delay_cluster.client()
    topic = delay_cluster.topic(PARTITIONS)
    with client.producer(topic) as producer:
        for i in range(FAIL_RECORDS):
            producer.send(b"%d" % i, deliver_after=timedelta(milliseconds=2_000 + i * 8))
        producer.flush(30)
    settings = SchedulerSettings(send_timeout=1.0)
    scheduler = Scheduler(client, tmp_path / "scheduler", settings, lambda: time.time_ns() // 1_000_000)
    caplog.set_level(logging.WARNING, logger="sluice.broker.schedule.scheduler")
    scheduler.start()
    try:
        time.sleep(3.0)  # deliveries under way
        for _ in range(3):  # a pause that met no batch in flight (a bucket read in meanwhile) is tried again
            with _paused(delay_cluster.broker):
                time.sleep(2.5)
            if _failed(caplog):
                break
            time.sleep(0.5)
        arrivals = collect(client, topic, PARTITIONS, FAIL_RECORDS, timeout=60)
        time.sleep(1.0)
        arrivals += collect(client, topic, PARTITIONS, FAIL_RECORDS + 1, timeout=1)[len(arrivals) :]
    finally:
        scheduler.stop()
    assert _failed(caplog), "no batch failed: the test missed its point"
    values = [int(a.record.value) for a in arrivals]
    assert sorted(set(values)) == list(range(FAIL_RECORDS)), "a record was lost"
    assert len(values) == FAIL_RECORDS, f"{len(values) - FAIL_RECORDS} records delivered twice"
    assert not [a for a in arrivals if a.received_ms < a.due], "a record was delivered early"
