"""The parking store's recovery (docs/poison-keys.md, "Dead letters once" and "The store's snapshot"),
against real processes (coordinator, broker, offset store, dispatcher), the dispatcher killed with SIGKILL.

- A kill between a parked key's dead letters (acknowledged by the DLQ) and their ``resolved`` event: the
  restart finds them in the DLQ by their source, from the store's DLQ mark, and writes none twice.
- Snapshots: a restart reads the last snapshot and only the log after it (the dispatcher says how many
  events), restores exactly the state before the kill, and falls back to the whole log when the last
  snapshot is bad (here: a trailer whose digest does not match). Every record is counted.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sluice import Client
from sluice.client.push import PushConsumer
from sluice.dispatcher.parkstore import CRASH_ENV, SNAPSHOT_ENV
from sluice.retry.parkbook import H_OP, H_PSOURCE
from sluice.retry.parksnap import snapshot_topic
from tests.integration.parking.test_park_store import persisted_mark_delete, read_all, wait_for
from tests.integration.push.conftest import PushCluster, run_push_cluster

POISON = b"poison"
RESTORED = re.compile(r"(\d+) parked keys restored from \S+ \(snapshot at (-?\d+), then (\d+) events(.*)\)")


@pytest.fixture(scope="module")
def cluster() -> Iterator[PushCluster]:
    with run_push_cluster() as c:
        yield c


def restart_with(cluster: PushCluster, monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    """kill -9 the dispatcher and start it again with ``env`` (the seams are read at start)."""
    for k in (CRASH_ENV, SNAPSHOT_ENV):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cluster.restart_dispatcher(kill=True)


def consume(pc: PushConsumer, until: Any, timeout: float = 60) -> list[int]:
    """Nack the poison key, ack the others, until ``until()``; returns the good values acknowledged."""
    good: list[int] = []
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out"
        try:
            m = pc.receive(timeout=0.1)
        except TimeoutError:
            continue
        if m.key == POISON:
            pc.nack(m)
        else:
            good.append(int(m.value))
            pc.ack(m)
    return good


def dlq_values(client: Client, topic: str) -> list[int]:
    """The DLQ's values in log order, read from the broker (no dispatcher needed)."""
    name = f"{topic}.s.DLQ"
    if not any(t.name == name for t in client.admin.list_topics()):
        return []
    end = client.list_offsets(name, "latest")[0]
    out: list[int] = []
    fetcher = client.fetcher({(name, 0): 0}, max_wait_ms=100)
    try:
        deadline = time.monotonic() + 30
        while fetcher.positions()[(name, 0)] < end:
            assert time.monotonic() < deadline, f"read {len(out)} of {end} records of {name}"
            out += [int(r.value) for r in fetcher.fetch(0.5)]
    finally:
        fetcher.close()
    return out


def test_a_kill_between_dead_letters_and_resolved_writes_each_dead_letter_once(
    cluster: PushCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = f"pdlq-{uuid.uuid4().hex[:6]}"
    with Client(cluster.bootstrap, request_timeout=10) as client:
        client.admin.create_topic(topic, partitions=1)
        with client.producer(topic, linger="1ms") as producer:
            for i in range(40):
                producer.send(str(i).encode(), key=POISON if i % 2 == 0 else f"ok{i % 5}".encode())
            producer.flush()
        poison = list(range(0, 40, 2))
        # The dispatcher kills itself once a parked key's messages are in the DLQ, before `resolved`.
        restart_with(cluster, monkeypatch, **{CRASH_ENV: "1"})
        dying = cluster.dispatcher
        settings: dict[str, Any] = {"nack_delay": "20ms", "max_redeliver": 1, "park_after": 1}
        with client.push_consumer(
            topic, "s", "key_shared", initial_position="earliest", park_max_messages=1000, **settings
        ) as pc:
            consume(pc, lambda: dying.process.poll() is not None)
            assert dying.process.returncode == -9
            before = dlq_values(client, topic)
            assert before, "dead letters before the kill"
            assert before == poison[: len(before)], "in order"
            restart_with(cluster, monkeypatch)
            # The consumer comes back and the subscription is loaded again (its store replayed).
            consume(pc, lambda: RESTORED.search(cluster.dispatcher.log()) is not None, 60)
            consume(pc, lambda: len(set(dlq_values(client, topic))) == len(poison), 60)
            settle = time.monotonic() + 1.5
            consume(pc, lambda: time.monotonic() > settle)  # anything written twice lands meanwhile
        dlq = dlq_values(client, topic)
        assert dlq == poison, f"each poison record once in the DLQ, in order (before the kill: {len(before)})"
        m = RESTORED.search(cluster.dispatcher.log())
        assert m is not None
        assert m.group(1) == "0", "the key's parked messages were found in the DLQ"


def test_a_restart_reads_the_last_snapshot_and_falls_back_to_the_log_when_it_is_bad(
    cluster: PushCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """600 records, every third of the poison key; hold policy, cap 25 (so the key cycles through the
    DLQ and probing), a snapshot every 100 events; then 10 more poison records, which end held."""
    topic = f"psnap-{uuid.uuid4().hex[:6]}"
    park = f"{topic}.s.PARK"
    restart_with(cluster, monkeypatch, **{SNAPSHOT_ENV: "100"})
    settings: dict[str, Any] = {
        "nack_delay": "10ms",
        "max_redeliver": 1,
        "park_after": 1,
        "park_hold": True,
        "park_max_messages": 25,
    }
    with Client(cluster.bootstrap, request_timeout=10) as client:
        client.admin.create_topic(topic, partitions=1)

        def send(values: range) -> None:
            with client.producer(topic, linger="2ms") as producer:
                for i in values:
                    producer.send(str(i).encode(), key=POISON if i % 3 == 0 else f"ok{i % 7}".encode())
                producer.flush()

        def held() -> list[Any]:
            keys = client.admin.list_parked_keys(topic, "s")
            return keys if keys and keys[0].state == "held" else []

        send(range(600))
        good = {i for i in range(600) if i % 3}
        with client.push_consumer(topic, "s", "key_shared", initial_position="earliest", **settings) as pc:
            seen = set(consume_until(pc, lambda got: good <= got, 120))
            assert good <= seen
            send(range(600, 630))  # ten more of the key: they end held behind their head
            more = {i for i in range(600, 630) if i % 3}
            consume_until(pc, lambda got: more <= got and bool(held()), 60)
            waiting, head = held()[0].waiting, held()[0].head_offset
            # Every record acknowledged on the persisted cursor (parked ones once stored): the restarts
            # below redeliver nothing.
            wait_for("the mark-delete at the end", lambda: persisted_mark_delete(cluster, topic, "s") == 630)
        poison = list(range(0, 630, 3))
        dlq_before = dlq_values(client, topic)
        events = read_all(client, park)
        assert any(e.headers.get(H_OP) == b"snapshot" for e in read_all(client, snapshot_topic(park)))
        restart_with(cluster, monkeypatch)
        listed = [(k.state, k.waiting, k.head_offset) for k in client.admin.list_parked_keys(topic, "s")]
        assert listed == [("stored", waiting, head)]

        def load() -> tuple[str, ...]:
            with client.push_consumer(
                topic, "s", "key_shared", initial_position="earliest", **settings
            ) as pc:
                wait_for("the key held again", lambda: [k.waiting for k in held()] == [waiting])
                with pytest.raises(TimeoutError):
                    pc.receive(timeout=0.3)  # held, and every good record was acknowledged before
            found = RESTORED.findall(cluster.dispatcher.log())
            assert found, cluster.dispatcher.log()[-3000:]
            return tuple(found[-1])

        keys, covers, replayed, note = load()
        assert (keys, note) == ("1", ""), note
        assert 0 < int(covers) < len(events)
        assert int(replayed) == len(events) - int(covers), "only the log after the snapshot"
        # A bad last snapshot (a trailer whose digest does not match): the whole log, the same state.
        with client.producer(snapshot_topic(park), linger="1ms") as producer:
            trailer = {H_OP: b"snapshot", "sluice-snap-covers": b"1", "sluice-snap-count": b"0"}
            producer.send(b"", headers={**trailer, "sluice-snap-digest": b"00"})
            producer.flush()
        restart_with(cluster, monkeypatch)
        keys, covers, replayed, note = load()
        assert (keys, covers) == ("1", "-1")
        assert "digest" in note, note
        assert int(replayed) == len(events), "the whole log"
        # That load wrote a snapshot at once: the next restart reads it, and nothing of the log after it.
        wait_for(
            "a new snapshot",
            lambda: (
                read_all(client, snapshot_topic(park))[-1].headers.get("sluice-snap-covers")
                == str(len(events)).encode()
            ),
        )
        restart_with(cluster, monkeypatch)
        assert load() == ("1", str(len(events)), "0", "")
        # Nothing lost, nothing twice: the DLQ, then the held records, are the poison key's in order.
        with client.push_consumer(topic, "s", "key_shared", initial_position="earliest", **settings) as pc:
            wait_for("held", held)
            assert client.admin.unpark_key(topic, "s", POISON) == waiting + 1
            rest = [pc.receive(timeout=10) for _ in range(waiting + 1)]
            for m in rest:
                pc.ack(m)
        assert dlq_values(client, topic) == dlq_before, "nothing dead-lettered again by the restarts"
        assert dlq_before + [int(m.value) for m in rest] == poison
        parks = [e.headers[H_PSOURCE] for e in events if e.headers.get(H_OP) == b"park"]
        assert len(parks) == len(set(parks))


def consume_until(pc: PushConsumer, done: Any, timeout: float) -> set[int]:
    """Nack the poison key, ack the others, until ``done(good values acknowledged)``."""
    got: set[int] = set()
    deadline = time.monotonic() + timeout
    while not done(got):
        assert time.monotonic() < deadline, f"timed out with {len(got)} good records"
        try:
            m = pc.receive(timeout=0.1)
        except TimeoutError:
            continue
        if m.key == POISON:
            pc.nack(m)
        else:
            got.add(int(m.value))
            pc.ack(m)
    return got


def test_no_snapshot_while_dispatchers_share_the_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    """Partitions of the topic on two dispatchers: each one's kept state misses the other's events, so
    neither writes a snapshot (one would be wrong for the other's partitions), while both park."""
    monkeypatch.setenv(SNAPSHOT_ENV, "5")
    with run_push_cluster(dispatchers=2) as two, Client(two.bootstrap, request_timeout=10) as client:
        for _ in range(20):
            topic = f"pmulti-{uuid.uuid4().hex[:6]}"
            client.admin.create_topic(topic, partitions=2)
            owners = [p.dispatcher_id for p in client.metadata([topic], refresh=True).topic(topic).partitions]
            if sorted(owners) == ["d1", "d2"]:
                break
        else:
            raise AssertionError("no topic split over both dispatchers")
        with client.producer(topic, linger="1ms") as producer:
            for i in range(60):
                p = i % 2
                key = POISON + str(p).encode() if i % 4 < 2 else f"ok{i}".encode()
                producer.send(str(i).encode(), key=key, partition=p)
            producer.flush()
        settings: dict[str, Any] = {"nack_delay": "10ms", "max_redeliver": 1, "park_after": 1}
        with client.push_consumer(topic, "s", "key_shared", initial_position="earliest", **settings) as pc:
            deadline = time.monotonic() + 60
            while len(dlq_values(client, topic)) < 30:
                assert time.monotonic() < deadline, "the poison keys never reached the DLQ"
                try:
                    m = pc.receive(timeout=0.1)
                except TimeoutError:
                    continue
                (pc.nack if m.key is not None and m.key.startswith(POISON) else pc.ack)(m)
        events = read_all(client, f"{topic}.s.PARK")
        assert len(events) > 10, "both dispatchers parked and resolved (well past a snapshot's 5 events)"
        assert {
            e.headers.get(H_PSOURCE, b"").split(b"/")[1] for e in events if e.headers.get(H_OP) == b"park"
        } == {
            b"0",
            b"1",
        }
        names = {t.name for t in client.admin.list_topics()}
        assert snapshot_topic(f"{topic}.s.PARK") not in names, "a snapshot written by one of two writers"
