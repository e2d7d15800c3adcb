"""Failover time and false elections under full load (docs/replication.md, "Failover time").

Three local brokers, a coordinator and a private Redis, as real processes; a topic of 4 partitions at
factor 3, min ISR 2. A producer (acks=all, idempotent) sending as fast as it can and a fetching consumer,
each its own process, load the 2-core machine fully for the whole run. Two phases:

- **false elections**: ``--quiet-seconds`` of load and no fault; every broker session expiry and every leader
  election the coordinator counts is a false one (``sluice_coordinator_session_expirations_total`` and
  ``..._leader_elections_total``);
- **failover**: ``--kills`` times, ``kill -9`` the leader of partition 0 under load and poll the metadata
  (every 20 ms) until each partition it led names another leader: that time is the failover time. The
  broker is restarted and the next kill waits until every replica is back in sync. A session expiry of a
  broker that was not killed counts as a false election here too.

The coordinator's ``--broker-session-timeout`` and ``--broker-heartbeat-interval`` are the knobs; run once
per profile (the default, and a tighter one).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from _stack import ROOT, save

sys.path.insert(0, str(ROOT))
from tests.harness import ServiceProcess, run_redis, start_service

PARTITIONS = 4
BROKERS = 3
TOPIC = "failover"
VALUE = b"x" * 100


class Cluster:
    def __init__(self, redis_url: str, data: Path, session: str, heartbeat: str, flush: str) -> None:
        self.data = data
        self.flush = flush
        self.coordinator = start_service(
            "coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", redis_url,
            "--broker-session-timeout", session, "--broker-heartbeat-interval", heartbeat,
        )  # fmt: skip
        self.brokers: dict[int, ServiceProcess] = {}
        for b in range(BROKERS):
            self.start_broker(b)

    def start_broker(self, b: int) -> None:
        self.brokers[b] = start_service(
            "broker", "--port", "0", "--metrics-port", "0", "--broker-id", str(b),
            "--data-dir", str(self.data / f"b{b}"), "--coordinator", self.coordinator.address,
            "--flush", self.flush,
        )  # fmt: skip

    def stop(self) -> None:
        for sp in self.brokers.values():
            sp.terminate()
        self.coordinator.terminate()

    def partitions(self) -> list[Any]:
        import grpc

        from sluice.v1 import coordinator_pb2 as cpb
        from sluice.v1 import coordinator_pb2_grpc

        with grpc.insecure_channel(self.coordinator.address) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            meta = stub.Metadata(cpb.MetadataRequest(topics=[TOPIC]), timeout=10)
        return list(meta.topics[0].partitions)

    def counter(self, name: str) -> float:
        """The sum of a coordinator counter over its labels."""
        text = urllib.request.urlopen(f"http://{self.coordinator.metrics}/metrics", timeout=5).read().decode()
        return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


@contextlib.contextmanager
def cluster(session: str, heartbeat: str, flush: str) -> Iterator[Cluster]:
    with run_redis(appendonly=False) as redis, tempfile.TemporaryDirectory(prefix="sluice-failover-") as d:
        c = Cluster(redis.url, Path(d), session, heartbeat, flush)
        try:
            yield c
        finally:
            c.stop()


def create(bootstrap: str) -> None:
    from sluice import Client
    from sluice.errors import InvalidReplicationFactor

    deadline = time.monotonic() + 30
    with Client(bootstrap) as client:
        while True:
            try:
                client.admin.create_topic(TOPIC, PARTITIONS, replication_factor=3, min_insync_replicas=2)
                return
            except InvalidReplicationFactor:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def produce(bootstrap: str, stop: Event) -> None:
    """As fast as it can, acks=all with idempotence; retried without end (a failover takes seconds)."""
    from datetime import timedelta

    from sluice import Client
    from sluice.client.producer.config import ProducerConfig

    config = ProducerConfig().replace(retries=1_000_000, delivery_timeout=timedelta(seconds=600))
    with Client(bootstrap) as client:
        producer = client.producer(TOPIC, config=config)
        i = 0
        while not stop.is_set():
            producer.send(VALUE, key=str(i & 1023).encode())
            i += 1
            if i % 5000 == 0:
                producer.flush(600)
        producer.close(60)


def fetch(bootstrap: str, stop: Event) -> None:
    from sluice import Client

    with Client(bootstrap) as client:
        fetcher = client.fetcher({(TOPIC, p): 0 for p in range(PARTITIONS)}, max_wait_ms=100)
        while not stop.is_set():
            with contextlib.suppress(Exception):  # a fetch during a failover: the next one goes on
                fetcher.fetch()
        fetcher.close()


def until(check: Any, timeout: float, period: float = 0.02) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise TimeoutError
        time.sleep(period)
    return time.monotonic() - started


def expired_brokers(c: Cluster) -> list[int]:
    return [int(b) for b in re.findall(r"broker (\d+) missed its heartbeats", c.coordinator.log())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--session-timeout", default="10s")
    parser.add_argument("--heartbeat-interval", default="2s")
    parser.add_argument("--quiet-seconds", type=float, default=30.0)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--flush", choices=["interval", "always"], default="interval")
    parser.add_argument("--name", default="default")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    with cluster(args.session_timeout, args.heartbeat_interval, args.flush) as c:
        bootstrap = c.coordinator.address
        create(bootstrap)
        until(lambda: all(len(p.isr) == 3 for p in c.partitions()), 30)
        load = [
            ctx.Process(target=produce, args=(bootstrap, stop)),
            ctx.Process(target=fetch, args=(bootstrap, stop)),
        ]
        for p in load:
            p.start()
        try:
            time.sleep(3)  # the load is up
            base = c.counter("sluice_coordinator_leader_elections_total")
            base_expiries = c.counter("sluice_coordinator_session_expirations_total")
            time.sleep(args.quiet_seconds)
            quiet_elections = c.counter("sluice_coordinator_leader_elections_total") - base
            quiet_expiries = c.counter("sluice_coordinator_session_expirations_total") - base_expiries
            print(
                f"quiet phase: {quiet_elections:g} elections, {quiet_expiries:g} session expiries", flush=True
            )
            failovers: list[float] = []
            killed: list[int] = []
            for _ in range(args.kills):
                parts = c.partitions()
                victim = parts[0].broker_id
                led = [p.partition for p in parts if p.broker_id == victim]
                c.brokers[victim].kill()
                killed.append(victim)

                def moved(victim: int = victim, led: list[int] = led) -> bool:
                    now = c.partitions()
                    return all(now[p].broker_id not in (victim, -1) for p in led)

                took = until(moved, 120)
                failovers.append(took)
                print(f"kill -9 of broker {victim} (leading {led}): led again after {took:.2f}s", flush=True)
                c.start_broker(victim)
                until(lambda: all(len(p.isr) == 3 for p in c.partitions()), 120, 0.2)
                time.sleep(2)
        finally:
            stop.set()
            for p in load:
                p.join(120)
        expiries = expired_brokers(c)
        false_expiries = len(expiries) - len(killed)
    result = {
        "profile": args.name,
        "session_timeout": args.session_timeout,
        "heartbeat_interval": args.heartbeat_interval,
        "flush": args.flush,
        "quiet_seconds": args.quiet_seconds,
        "quiet_elections": quiet_elections,
        "quiet_session_expiries": quiet_expiries,
        "false_session_expiries_whole_run": false_expiries,
        "failover_s": [round(f, 3) for f in failovers],
        "failover_median_s": round(statistics.median(failovers), 3) if failovers else None,
        "failover_max_s": round(max(failovers), 3) if failovers else None,
    }
    save(f"failover_{args.name}", result)


if __name__ == "__main__":
    main()
