"""Per-key poison parking for pull consumers (docs/poison-keys.md, "Pull consumers"), against a real
coordinator, broker and offset store: one poison key among many, the parking across a consumer restart,
and the hold policy with ``sluice group parked`` / ``unpark``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from sluice import Client
from sluice.client.consumer import Consumer
from sluice.codec.batch import Record
from sluice.errors import InvalidArgument, RecordNotOwned
from sluice.retry.levels import H_COUNT, dlq_topic, retry_info
from sluice.retry.parkbook import H_OP, H_PSOURCE, ParkBook, park_topic
from tests.integration.retry.conftest import RetryCluster, read_all

POISON = b"poison"
PARK_CFG: dict[str, Any] = {
    "auto_offset_reset": "earliest",
    "fetch_max_wait": "100ms",
    "session_timeout": "2s",
    "park_poison_keys": True,
    "max_redeliver": 2,
    "park_retry_delay": "150ms",
    "enable_auto_commit": False,
}


def _produce(
    client: Client, topic: str, good_keys: int, per_key: int, poison: int, start: int = 0
) -> dict[bytes, list[bytes]]:
    """``good_keys`` keys with ``per_key`` records each, and ``poison`` records of the poison key spread
    evenly among them. Returns the values per key, in send order."""
    sent: dict[bytes, list[bytes]] = defaultdict(list)
    total = good_keys * per_key
    every = max(total // max(poison, 1), 1)
    n_poison = 0
    with client.producer(topic) as p:
        for i in range(total):
            key = f"k{i % good_keys}".encode()
            value = f"{key.decode()}-{start + i}".encode()
            p.send(value, key=key)
            sent[key].append(value)
            if i % every == 0 and n_poison < poison:
                value = f"poison-{start + n_poison}".encode()
                p.send(value, key=POISON)
                sent[POISON].append(value)
                n_poison += 1
        p.flush(10)
    return sent


class Run:
    """What one consumer loop saw."""

    def __init__(self) -> None:
        self.good: dict[bytes, list[bytes]] = defaultdict(list)
        self.poison_deliveries: list[bytes] = []
        self.parked_skipped = 0
        self.last_good_at = 0.0


def _consume(consumer: Consumer, run: Run, until: Any, timeout: float, fail_poison: bool = True) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, f"not done within {timeout}s"
        for r in consumer.poll(0.2):
            if consumer.is_parked(r):
                run.parked_skipped += 1
                continue
            if r.key == POISON:
                run.poison_deliveries.append(r.value)
                if fail_poison:
                    consumer.fail(r)
                continue
            run.good[r.key].append(r.value)  # type: ignore[index]
            run.last_good_at = time.monotonic()


def _dlq_values(client: Client, group: str) -> list[bytes]:
    return [r.value for r in read_all(client, dlq_topic(group))]


def _book(client: Client, group: str) -> ParkBook:
    book = ParkBook()
    for event in read_all(client, park_topic(group)):
        book.apply(event)
    return book


def _all_committed(consumer: Consumer, client: Client, topic: str, partitions: int) -> None:
    consumer.commit()
    ends = client.list_offsets(topic, "latest")
    committed = consumer.committed([(topic, p) for p in range(partitions)])
    assert committed == {(topic, p): ends[p] for p in range(partitions)}, (committed, ends)


def _check_good(run: Run, sent: dict[bytes, list[bytes]]) -> int:
    good = {k: v for k, v in sent.items() if k != POISON}
    dupes = {k: n for k, vs in run.good.items() for v, n in Counter(vs).items() if n > 1}
    assert not dupes, f"good records delivered twice: {dupes}"
    assert dict(run.good) == good, "every good record, once, in order per key"
    return sum(len(v) for v in good.values())


def test_one_poison_key_among_many_ends_in_the_dlq_in_order(cluster: RetryCluster) -> None:
    topic, group = cluster.topic(2, "pk"), cluster.group("park")
    client = cluster.client()
    sent = _produce(client, topic, good_keys=200, per_key=10, poison=60)
    consumer = client.consumer(group, [topic], **{**PARK_CFG, "park_retry_delay": "1s"})
    run = Run()
    goods_at_first_retry: list[int] = []

    def goods() -> int:
        n = sum(map(len, run.good.values()))
        if len(run.poison_deliveries) >= 2 and not goods_at_first_retry:
            goods_at_first_retry.append(n)
        return n

    started = time.monotonic()
    _consume(consumer, run, lambda: goods() == 2000 and len(_dlq_values(client, group)) == 60, timeout=60)
    good_secs = run.last_good_at - started
    dlq_secs = time.monotonic() - started
    # Every other key flowed while the poison key waited out its delay: all delivered before its retry.
    assert goods_at_first_retry == [2000]
    # The key is released after the DLQ: its next records park it again (a second cycle).
    more = _produce(client, topic, good_keys=200, per_key=5, poison=30, start=2000)
    _consume(consumer, run, lambda: goods() == 3000 and len(_dlq_values(client, group)) == 90, timeout=60)
    for key, values in more.items():
        sent[key] += values
    good = _check_good(run, sent)
    assert _dlq_values(client, group) == sent[POISON], "the poison key's records in the DLQ, in order, once"
    dead = read_all(client, dlq_topic(group))
    info = retry_info(dead[0].headers)
    assert info is not None
    assert (info.topic, dead[0].headers[H_COUNT]) == (topic, b"3")
    # Only heads are tried, each 1 + max_redeliver times; the records waiting behind them never reach the
    # application (redelivering every poison record would take 270 deliveries).
    tries = Counter(run.poison_deliveries)
    assert set(tries.values()) == {3}, tries
    assert 2 <= len(tries) <= 10, tries
    _all_committed(consumer, client, topic, 2)
    assert not _book(client, group).keys, "nothing parked once all went to the DLQ"
    consumer.close()
    print(
        f"good {good}: first 2000 in {good_secs:.2f}s; poison: {len(run.poison_deliveries)} deliveries of "
        f"{len(tries)} heads for 90 records, {run.parked_skipped} recalled from a batch; "
        f"first 60 in the DLQ after {dlq_secs:.2f}s"
    )


def test_parking_survives_a_consumer_restart(cluster: RetryCluster) -> None:
    topic, group = cluster.topic(1, "pr"), cluster.group("park")
    client = cluster.client()
    sent = _produce(client, topic, good_keys=50, per_key=10, poison=20)
    cfg = {**PARK_CFG, "max_redeliver": 3, "park_retry_delay": "5s"}
    consumer = client.consumer(group, [topic], **cfg)
    run = Run()

    def parked() -> int:
        pk = consumer._park.book.keys.get(((topic, 0), POISON))  # type: ignore[union-attr]
        return len(pk.pending) if pk is not None else 0

    # The first failure parks the key; every later poison record is parked behind it (5 s: not retried
    # before the restart), while the 500 good records flow.
    _consume(consumer, run, lambda: sum(map(len, run.good.values())) == 500 and parked() == 20, timeout=30)
    assert set(run.poison_deliveries) == {b"poison-0"}, "later records of the parked key never delivered"
    _all_committed(consumer, client, topic, 1)  # parking does not hold the commits back
    consumer.close()
    book = _book(client, group)
    assert [r.value for r in book.keys[((topic, 0), POISON)].pending] == sent[POISON], "parked in order"

    # More poison records while no consumer runs: they park behind the others at the next start.
    extra = [f"poison-late-{i}".encode() for i in range(5)]
    with client.producer(topic) as p:
        for v in extra:
            p.send(v, key=POISON)
    client2 = cluster.client()
    consumer2 = client2.consumer(group, [topic], **{**cfg, "park_retry_delay": "100ms"})
    run2 = Run()
    _consume(consumer2, run2, lambda: len(_dlq_values(client2, group)) == 25, timeout=60)
    assert not run2.good, "committed good records are not delivered again"
    # The head's count survives the restart: 1 + max_redeliver deliveries in all, then the DLQ.
    head_tries = run.poison_deliveries.count(b"poison-0") + run2.poison_deliveries.count(b"poison-0")
    assert head_tries == 4, (run.poison_deliveries, run2.poison_deliveries)
    assert _dlq_values(client2, group) == sent[POISON] + extra, "all of the key, in order, once"
    _all_committed(consumer2, client2, topic, 1)
    consumer2.close()


def test_hold_policy_keeps_the_key_until_unpark(cluster: RetryCluster, capsys: Any) -> None:
    from sluice.cli.main import main as cli

    topic, group = cluster.topic(1, "ph"), cluster.group("park")
    client = cluster.client()
    sent = _produce(client, topic, good_keys=20, per_key=5, poison=5)
    cfg = {**PARK_CFG, "max_redeliver": 1, "parked_policy": "hold", "park_retry_delay": "50ms"}
    consumer = client.consumer(group, [topic], **cfg)
    run = Run()
    # Fail the head until it is held: 1 + max_redeliver deliveries, then nothing more.
    _consume(
        consumer, run, lambda: sum(map(len, run.good.values())) == 100 and len(run.poison_deliveries) == 2, 30
    )
    assert consumer.poll(0.5) == [], "a held key is not delivered"
    assert _dlq_values(client, group) == []
    assert cli(["--bootstrap", cluster.bootstrap, "group", "parked", group, "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [
        (k["topic"], k["partition"], k["key"], k["state"], k["waiting"], k["failures"]) for k in listed
    ] == [(topic, 0, "poison", "held", 5, 2)]
    assert cli(["--bootstrap", cluster.bootstrap, "group", "parked", group]) == 0
    assert "held" in capsys.readouterr().out
    assert cli(["--bootstrap", cluster.bootstrap, "group", "unpark", group, "poison"]) == 0
    # Released: the records come again in order, counted from 0; this time they succeed.
    deadline = time.monotonic() + 20
    got: list[Record] = []
    while len(got) < 5:
        assert time.monotonic() < deadline, f"unparked records did not come: {got}"
        got += [r for r in consumer.poll(0.2) if r.key == POISON]
    assert [r.value for r in got] == sent[POISON]
    consumer.poll(0.5)  # processed: the last head is settled
    assert not _book(client, group).keys
    consumer.close()


def test_fail_refuses_what_it_cannot_park(cluster: RetryCluster) -> None:
    topic, group = cluster.topic(1, "pb"), cluster.group("park")
    client = cluster.client()
    with client.producer(topic) as p:
        p.send(b"no-key")
        p.send(b"keyed", key=b"k")
        p.flush(10)
    plain = client.consumer(cluster.group("plain"), [topic], auto_offset_reset="earliest")
    got = _poll_n(plain, 2)
    with pytest.raises(InvalidArgument, match="park_poison_keys=True"):
        plain.fail(got[1])
    plain.close()
    consumer = client.consumer(group, [topic], **PARK_CFG)
    keyless, keyed = _poll_n(consumer, 2)
    with pytest.raises(InvalidArgument, match="without a key cannot be parked"):
        consumer.fail(keyless)
    consumer.commit()
    with pytest.raises(RecordNotOwned, match="committed already"):
        consumer.fail(keyed)
    assert read_all(client, park_topic(group)) == [], "nothing parked"
    consumer.close()


def _poll_n(consumer: Consumer, n: int) -> list[Record]:
    out: list[Record] = []
    deadline = time.monotonic() + 15
    while len(out) < n:
        assert time.monotonic() < deadline
        out += consumer.poll(0.2)
    return out


def test_kill_after_parking_before_the_commit_parks_nothing_twice(cluster: RetryCluster) -> None:
    topic, group = cluster.topic(1, "pc"), cluster.group("park")
    client = cluster.client()
    sent = _produce(client, topic, good_keys=30, per_key=10, poison=15)
    script = Path(__file__).with_name("park_crash_member.py")
    proc = subprocess.run(
        [sys.executable, str(script), cluster.bootstrap, group, topic, POISON.decode(), "15"],
        capture_output=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    killed_at = time.monotonic()
    assert client.admin.group_offsets(group).get((topic, 0)) is None, "the dead member committed nothing"
    # The next member reads the partition from 0 again: every poison record is parked already.
    consumer = client.consumer(group, [topic], **{**PARK_CFG, "max_redeliver": 3, "park_retry_delay": "50ms"})
    run = Run()
    _consume(consumer, run, lambda: len(_dlq_values(client, group)) >= 15 and len(run.good) == 30, timeout=60)
    print(f"after the kill: the DLQ complete in {time.monotonic() - killed_at:.2f}s")
    assert set(run.poison_deliveries) == {b"poison-0"}, "only the head is tried; the others stay parked"
    assert _dlq_values(client, group) == sent[POISON], "in the DLQ in order, each once"
    parks = Counter(
        r.headers[H_PSOURCE] for r in read_all(client, park_topic(group)) if r.headers.get(H_OP) == b"park"
    )
    assert len(parks) == 15
    assert set(parks.values()) == {1}, "no record parked twice"
    _check_good(run, sent)  # the good records again (nothing was committed), once each
    _all_committed(consumer, client, topic, 1)
    consumer.close()


def test_a_key_past_the_cap_goes_to_the_dlq_even_when_held(cluster: RetryCluster) -> None:
    topic, group = cluster.topic(1, "pm"), cluster.group("park")
    client = cluster.client()
    sent = _produce(client, topic, good_keys=20, per_key=5, poison=12)
    cfg = {**PARK_CFG, "max_redeliver": 1, "parked_policy": "hold", "park_max_messages": 5}
    consumer = client.consumer(group, [topic], **{**cfg, "park_retry_delay": "50ms"})
    run = Run()

    def settled() -> bool:
        book = _book(client, group)
        held = [pk for pk in book.keys.values() if pk.count > 1]
        waiting = sum(len(pk.pending) for pk in book.keys.values())
        # Either everything went over the cap at once, or the rest parked again and is held.
        return (
            len(run.good) == 20
            and len(_dlq_values(client, group)) + waiting == 12
            and (not waiting or bool(held))
        )

    _consume(consumer, run, settled, timeout=30)
    dead = _dlq_values(client, group)
    parked = [r.value for pk in _book(client, group).keys.values() for r in pk.pending]
    assert dead, "past the cap: to the DLQ, hold or not"
    assert len(parked) <= 5
    assert dead + parked == sent[POISON], (
        "the key's order holds across the cap: DLQ first, then the held rest"
    )
    _check_good(run, sent)
    consumer.close()


def test_an_auto_commit_waits_for_the_parking_writes(cluster: RetryCluster) -> None:
    """poll() no longer waits for the parking writes it sent (Parker.pace); the commits must. With the
    broker paused (SIGSTOP), the diverted records' parking cannot be acknowledged: the auto-commit that
    comes due must wait rather than commit past them (a crash then would lose them)."""
    topic, group = cluster.topic(1, "pw"), cluster.group("park")
    client = cluster.client()
    with client.producer(topic) as p:
        for i in range(100):
            key = POISON if i % 5 == 0 else f"k{i}".encode()
            p.send(f"v{i}".encode(), key=key)
        p.flush(10)
    cfg = {**PARK_CFG, "enable_auto_commit": True, "auto_commit_interval": "100ms", "park_retry_delay": "60s"}
    consumer = client.consumer(group, [topic], **cfg)
    head = _first(consumer)
    assert (head.offset, head.key) == (0, POISON)
    consumer.fail(head)  # parks the key (acknowledged: the broker runs)
    time.sleep(0.5)  # the prefetch holds the rest of the partition
    proc = cluster.broker.process
    proc.send_signal(signal.SIGSTOP)
    try:
        got = consumer.poll(0.5)  # diverts records 5, 10, ...: sent, not acknowledged
        assert got, "records came from the prefetch buffer"
        assert all(r.key != POISON for r in got)
        waiting = threading.Thread(target=consumer.poll, args=(0.5,))
        waiting.start()  # the auto-commit comes due in this poll
        time.sleep(1.5)
        assert waiting.is_alive(), "the poll's auto-commit waits for the parking writes"
        committed = client.admin.group_offsets(group).get((topic, 0), 0)
        assert committed <= 5, f"committed {committed}: past record 5, whose parking is not acknowledged"
    finally:
        proc.send_signal(signal.SIGCONT)
    waiting.join(15)
    consumer.commit()
    parked = [r.value for r in _book(client, group).keys[((topic, 0), POISON)].pending]
    assert parked == [f"v{i}".encode() for i in range(0, 100, 5)], "every poison record parked, in order"
    _all_committed(consumer, client, topic, 1)
    consumer.close()


def _first(consumer: Consumer) -> Record:
    deadline = time.monotonic() + 15
    while True:
        assert time.monotonic() < deadline, "no record"
        got = consumer.poll(0.2, max_records=1)
        if got:
            return got[0]
