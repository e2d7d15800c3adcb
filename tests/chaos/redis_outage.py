"""Issue 16, "Redis down or slow", shared by the suite's short run (``tests/chaos/test_redis_outage.py``) and
the full one (``bench/chaos/redis_outage.py``, 30 s outages): Redis stopped (``kill -9``, restarted on its
port with its data), and separately paused (``CLIENT PAUSE ALL``), under group consumption: a consumer
committing after every poll while a producer produces, and a push subscription (a dispatcher saving its
cursor through the offset store into Redis) consumed alongside.

Must show: no service exits, no acknowledged commit is lost (every offset a ``commit()`` returned is in Redis
afterwards), consumption resumes by itself, and no service prints a traceback (one rate-limited warning per
outage, not one per request). Redis runs with AOF and ``appendfsync always`` (the harness, as ``sluice up``),
so the restart after ``kill -9`` keeps every acknowledged write. Prints the counts: commits acknowledged,
commits reported in doubt (``CommitOutcomeUnknown``), other failed commits, duplicates re-consumed.
"""

from __future__ import annotations

import collections
import contextlib
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.chaos.cluster import until
from tests.harness import ServiceProcess, run_redis, start_service
from tests.integration.consumer.conftest import Cluster, start_cluster

GROUP = "outage"
TOPIC = "outage"
PARTITIONS = 2


@dataclass
class Tally:
    produced: int = 0
    acked: int = 0
    in_doubt: int = 0
    failed: collections.Counter[str] = field(default_factory=collections.Counter)
    #: (partition, offset) -> how often it was consumed.
    seen: collections.Counter[tuple[int, int]] = field(default_factory=collections.Counter)
    #: tp -> the highest offset a commit() returned as stored.
    acknowledged: dict[tuple[str, int], int] = field(default_factory=dict)
    #: (partition, offset) -> how often the push subscription delivered it (its cursor is saved through
    #: the offset store into Redis by the dispatcher).
    pushed: collections.Counter[tuple[int, int]] = field(default_factory=collections.Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self) -> tuple[int, int]:
        with self.lock:
            return len(self.seen), self.acked

    def pushed_distinct(self) -> int:
        with self.lock:
            return len(self.pushed)


@contextlib.contextmanager
def outage_stack() -> Iterator[tuple[Cluster, ServiceProcess]]:
    with run_redis(appendonly=True, appendfsync="always") as r, tempfile.TemporaryDirectory() as d:
        c = start_cluster(r, Path(d))
        dispatcher = start_service(
            "dispatcher",
            *("--port", "0", "--metrics-port", "0", "--coordinator", c.coordinator.address),
            *("--dispatcher-id", "d1", "--cursor-flush-interval", "50ms"),
        )
        try:
            yield c, dispatcher
        finally:
            dispatcher.terminate()
            c.stop()


def _produce(cluster: Cluster, tally: Tally, stop: threading.Event) -> None:
    with cluster.client().producer(TOPIC, partitioner="round_robin", linger="5ms") as producer:
        i = 0
        while not stop.is_set():
            producer.send(b"%d" % i)
            i += 1
            if i % 20 == 0:
                producer.flush()
                with tally.lock:
                    tally.produced = i
                stop.wait(0.05)  # ~400 records/s: a steady trickle, not a load test
        producer.flush()
        with tally.lock:
            tally.produced = i


def _consume(
    cluster: Cluster, tally: Tally, stop: threading.Event, drained: threading.Event, commit_timeout: str
) -> None:
    consumer = cluster.client().consumer(
        GROUP,
        [TOPIC],
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait="100ms",
        request_timeout=commit_timeout,
    )
    try:
        while not (stop.is_set() and drained.is_set()):
            records = consumer.poll(0.2)
            with tally.lock:
                for r in records:
                    tally.seen[(r.partition, r.offset)] += 1
            if not records:
                continue
            try:
                committed = consumer.commit()
            except Exception as exc:  # counted, not raised: the loop must go on through the outage
                with tally.lock:
                    if type(exc).__name__ == "CommitOutcomeUnknown":
                        tally.in_doubt += 1
                    else:
                        tally.failed[type(exc).__name__] += 1
                continue
            with tally.lock:
                tally.acked += 1
                for tp, off in committed.items():
                    tally.acknowledged[tp] = max(off, tally.acknowledged.get(tp, -1))
    finally:
        consumer.close()


def _push(cluster: Cluster, tally: Tally, stop: threading.Event) -> None:
    from sluice.errors import RequestTimedOut

    with cluster.client().push_consumer(TOPIC, "push", "exclusive", initial_position="earliest") as pc:
        while not stop.is_set():
            try:
                msg = pc.receive(timeout=0.2)
            except RequestTimedOut:
                continue
            with tally.lock:
                tally.pushed[(msg.partition, msg.offset)] += 1
            pc.ack(msg)


def _resumed(tally: Tally, after: tuple[int, int]) -> bool:
    seen, acked = tally.snapshot()
    return seen > after[0] and acked > after[1]


def _alive(cluster: Cluster, *more: ServiceProcess) -> None:
    for sp in (cluster.coordinator, cluster.broker, cluster.offset_store, *more):
        assert sp.process.poll() is None, (
            f"{sp.service} exited ({sp.process.returncode}):\n{sp.log()[-3000:]}"
        )


def _outage(cluster: Cluster, dispatcher: ServiceProcess, tally: Tally, what: str, outage_s: float) -> float:
    """Take Redis away for ``outage_s`` (``stop``: kill -9, then restart on its port with its data; ``pause``:
    CLIENT PAUSE ALL); return how long consumption took to resume after Redis came back."""
    if what == "stop":
        cluster.redis.kill()
        time.sleep(outage_s)  # the outage itself: its length is the point, nothing to wait on
        _alive(cluster, dispatcher)
        cluster.redis.restart()
    else:
        with redis.Redis(port=cluster.redis.port) as r:
            r.execute_command("CLIENT", "PAUSE", int(outage_s * 1000), "ALL")
        time.sleep(outage_s)
    back, pushed = tally.snapshot(), tally.pushed_distinct()
    took = until(lambda: _resumed(tally, back), f"consumption to resume after Redis {what}", timeout=90)
    until(lambda: tally.pushed_distinct() > pushed, f"push delivery to resume after Redis {what}", timeout=90)
    _alive(cluster, dispatcher)
    return took


def run(cluster: Cluster, dispatcher: ServiceProcess, outage_s: float, commit_timeout: str) -> str:
    """Both outages of ``outage_s`` each under the load, then every check (AssertionError on a failure);
    returns the counts. ``commit_timeout``: the consumer's ``request_timeout``, shorter than the outage so
    a commit sent into the pause runs out of time and is reported in doubt."""
    cluster.client().admin.create_topic(TOPIC, partitions=PARTITIONS)
    tally = Tally()
    stop, drained = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def guarded(fn: object, *args: object) -> None:
        try:
            fn(*args)  # type: ignore[operator]
        except BaseException as exc:
            errors.append(exc)

    producer = threading.Thread(target=guarded, args=(_produce, cluster, tally, stop), daemon=True)
    consumer = threading.Thread(
        target=guarded, args=(_consume, cluster, tally, stop, drained, commit_timeout), daemon=True
    )
    pusher = threading.Thread(target=guarded, args=(_push, cluster, tally, drained), daemon=True)
    producer.start()
    consumer.start()
    pusher.start()
    until(lambda: tally.snapshot()[1] >= 5, "the consumer to commit", timeout=60)

    resumed = {what: _outage(cluster, dispatcher, tally, what, outage_s) for what in ("stop", "pause")}

    stop.set()
    producer.join(60)
    until(lambda: tally.snapshot()[0] >= tally.produced, "every record consumed", timeout=60)
    until(lambda: tally.pushed_distinct() >= tally.produced, "every record pushed", timeout=60)
    drained.set()
    consumer.join(60)
    pusher.join(60)
    assert not errors, errors
    assert not producer.is_alive()
    assert not consumer.is_alive()
    assert not pusher.is_alive()
    _alive(cluster, dispatcher)

    # No acknowledged commit lost: the stored offset of each partition is at least the highest one a
    # commit() returned (commits only increase, so a later one may have moved it further).
    with redis.Redis(port=cluster.redis.port, decode_responses=True) as r:
        stored = r.hgetall(f"sluice:off:{{{GROUP}}}:default")
    lost = {
        tp: off for tp, off in tally.acknowledged.items() if int(stored.get(f"{tp[0]}/{tp[1]}", -1)) < off
    }
    assert not lost, f"acknowledged commits missing from Redis: {lost} (stored {stored})"
    # Nothing consumed was lost either: every produced offset came at least once.
    assert sum(tally.seen.values()) >= tally.produced
    duplicates = sum(n - 1 for n in tally.seen.values())
    redelivered = sum(n - 1 for n in tally.pushed.values())
    services = (cluster.coordinator, cluster.offset_store, dispatcher)
    tracebacks = {sp.service: sp.log().count("Traceback") for sp in services}
    warnings = {sp.service: sp.log().count(" WARNING ") for sp in services}
    summary = (
        f"redis outage ({outage_s:g} s each, commit timeout {commit_timeout}): "
        f"produced {tally.produced}, consumed {len(tally.seen)} distinct "
        f"(+{duplicates} duplicates), commits acknowledged {tally.acked}, in doubt {tally.in_doubt}, "
        f"pushed {len(tally.pushed)} distinct (+{redelivered} redelivered), "
        f"failed {dict(tally.failed)}, resumed after {resumed} s, "
        f"warnings {warnings}, tracebacks {tracebacks}"
    )
    print("\n" + summary)
    for sp in services:  # what the warnings say, for the record (-s)
        for line in sp.log().splitlines():
            if " WARNING " in line:
                print(f"  {sp.service}: {line.split(' WARNING ', 1)[1][:160]}")
    assert tracebacks == {"coordinator": 0, "offset-store": 0, "dispatcher": 0}, "a traceback in a log"
    # The offset store: one warning when Redis fails, one per 10 s while it stays down and one when it is
    # back, per outage; not one per request (common/redis_client.py, RateLimitedWarning).
    assert warnings["offset-store"] <= 2 * (2 + outage_s / 10) + 2, cluster.offset_store.log()[-5000:]
    assert warnings["dispatcher"] <= 2 * (2 + outage_s / 10) + 10, dispatcher.log()[-5000:]
    # A commit sent into the pause had no answer within the SDK's timeout: reported in doubt, never as
    # stored, and the increase-only retry after the pause is harmless (nothing above is lost).
    assert tally.in_doubt >= 1
    return summary
