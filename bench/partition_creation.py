"""Time to create 1,000 partitions with 0, 5,000 and 10,000 already there (issue 20: flat within 20%).

One broker, one coordinator, a private Redis, as processes. At each level the cluster is first filled
with topics (``fill-*``, 1,000 partitions each) until it holds ``level`` partitions, then the broker is
restarted and allowed to settle (its first heartbeat after a restart brings the full assignment), and then
``--topics`` topics of ``--partitions`` partitions each are created one after another, each CreateTopic
waiting for the broker's acknowledgement as it does for a user, and deleted again (``--rounds`` times; the
median round is reported). Reported per level: the wall time for them all, the slowest CreateTopic, and the
CPU the broker and the coordinator used meanwhile, and the **produce stall**: a thread produces one
record at a time (send, then flush: each waits for the broker's answer) to a partition that already
exists, all through the round; the longest and the 99th-percentile round trip are reported (an
UpdatePartitions that creates its logs on the broker's event loop holds every produce for as long).

The broker is restarted before every fill of at most ``FILL_CHUNK`` partitions and before each
measurement: until the descriptor work of issue 20 lands, a partition created in a process holds 3 file
descriptors and one opened at start-up 1, and 10,000 created ones would exceed a 20,000 limit.

Run: ``.venv/bin/python bench/partition_creation.py`` (``--tmpfs`` puts the data directory in /dev/shm,
which takes the disk's fsync latency out and leaves the CPU work that could grow with the cluster).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from _stack import ROOT, cpu_seconds, save
from sluice import Client

sys.path.insert(0, str(ROOT))
from tests.harness import ServiceProcess, run_redis, start_service

FILL_CHUNK = 4_000
FILL_TOPIC_PARTITIONS = 1_000
START_TIMEOUT_S = 300.0
SETTLE_TIMEOUT_S = 120.0


@dataclass
class Level:
    existing: int
    created: int
    seconds: float
    slowest_create_s: float
    median_create_s: float
    broker_cpu_s: float
    coordinator_cpu_s: float
    #: Partitions the coordinator lists afterwards (checked against what was created).
    listed: int
    #: The produce probe during the round: how many, the longest and the p99 round trip (ms).
    produces: int = 0
    produce_max_ms: float = 0.0
    produce_p99_ms: float = 0.0


class ProduceProbe:
    """Produces one record at a time to ``topic`` in a thread and keeps each round trip (s)."""

    def __init__(self, client: Client, topic: str) -> None:
        self._producer = client.producer(topic)
        self._stop = threading.Event()
        self.times: list[float] = []
        self._thread = threading.Thread(target=self._run, name="produce-probe", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set() and len(self.times) < 1_000_000:
            t = time.perf_counter()
            self._producer.send(b"probe", partition=0)
            self._producer.flush(timeout=120)
            self.times.append(time.perf_counter() - t)
            self._stop.wait(0.005)  # ~200 produces/s: a light, steady load

    def __enter__(self) -> ProduceProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=130)
        self._producer.close(timeout=10)


class Cluster:
    def __init__(self, coordinator: ServiceProcess, broker: ServiceProcess, client: Client) -> None:
        self.coordinator = coordinator
        self.broker = broker
        self.client = client
        self.partitions = 0
        self._fills = 0

    def restart_broker(self) -> None:
        self.broker.terminate(timeout=120)
        self.broker = start_service(self.broker.service, *self.broker.args, timeout=START_TIMEOUT_S)
        self._settle()

    def _settle(self) -> None:
        """Wait (bounded) until the restarted broker applied its full assignment from the coordinator."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while "partitions updated to v" not in self.broker.log():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the broker did not settle:\n{self.broker.log()[-3000:]}")
            time.sleep(0.1)

    def fill_to(self, target: int) -> None:
        while self.partitions < target:
            chunk_end = min(target, self.partitions + FILL_CHUNK)
            self.restart_broker()
            while self.partitions < chunk_end:
                n = min(FILL_TOPIC_PARTITIONS, chunk_end - self.partitions)
                self.client.admin.create_topic(f"fill-{self._fills}", partitions=n)
                self._fills += 1
                self.partitions += n

    def measure(self, level: int, topics: int, partitions: int, rounds: int) -> Level:
        """``rounds`` times: create the topics (timed), check the count, delete them again (not timed);
        the round with the median time is reported. A warm-up topic first, so no round pays for cold
        connections."""
        self.restart_broker()
        self.client.admin.create_topic(f"warmup-{level}", partitions=1)
        self.partitions += 1
        measured = []
        for r in range(rounds):
            names = [f"level{level}-{r}-{i}" for i in range(topics)]
            measured.append(self._round(names, partitions, level))
            for name in names:
                self.client.admin.delete_topic(name)
            self.partitions -= topics * partitions
        measured.sort(key=lambda lv: lv.seconds)
        return measured[len(measured) // 2]

    def _round(self, names: list[str], partitions: int, level: int) -> Level:
        broker0, coord0 = cpu_seconds(self.broker.process.pid), cpu_seconds(self.coordinator.process.pid)
        times = []
        with ProduceProbe(self.client, f"warmup-{level}") as probe:
            start = time.perf_counter()
            for name in names:
                t = time.perf_counter()
                self.client.admin.create_topic(name, partitions=partitions)
                times.append(time.perf_counter() - t)
            seconds = time.perf_counter() - start
        produced = sorted(probe.times) or [0.0]
        broker_cpu = cpu_seconds(self.broker.process.pid) - broker0
        coordinator_cpu = cpu_seconds(self.coordinator.process.pid) - coord0
        self.partitions += len(names) * partitions
        listed = sum(len(t.partitions) for t in self.client.admin.list_topics())
        if listed != self.partitions:
            raise RuntimeError(f"the coordinator lists {listed} partitions, {self.partitions} were created")
        return Level(
            existing=level,
            created=len(names) * partitions,
            seconds=round(seconds, 3),
            slowest_create_s=round(max(times), 3),
            median_create_s=round(statistics.median(times), 3),
            broker_cpu_s=round(broker_cpu, 3),
            coordinator_cpu_s=round(coordinator_cpu, 3),
            listed=listed,
            produces=len(probe.times),
            produce_max_ms=round(produced[-1] * 1000, 1),
            produce_p99_ms=round(produced[int(0.99 * (len(produced) - 1))] * 1000, 1),
        )


@contextlib.contextmanager
def cluster(data_root: str | None) -> Iterator[Cluster]:
    with (
        run_redis(appendonly=False) as redis,
        tempfile.TemporaryDirectory(prefix="sluice-bench-create-", dir=data_root) as d,
        contextlib.ExitStack() as running,
    ):
        coord = start_service("coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url)
        running.callback(coord.terminate)
        broker = start_service(
            "broker", "--port", "0", "--metrics-port", "0", "--broker-id", "0", "--data-dir",
            str(Path(d) / "broker"), "--coordinator", coord.address, "--flush", "interval",
        )  # fmt: skip
        c = Cluster(coord, broker, running.enter_context(Client(coord.address)))
        running.callback(lambda: c.broker.terminate(timeout=120))
        yield c


def run(levels: list[int], topics: int, partitions: int, rounds: int, data_root: str | None) -> list[Level]:
    results = []
    with cluster(data_root) as c:
        for level in sorted(levels):
            if level < c.partitions:
                raise SystemExit(f"level {level} is below the {c.partitions} partitions already created")
            c.fill_to(level)
            result = c.measure(level, topics, partitions, rounds)
            print(
                f"existing {result.existing:>6}: {result.created} partitions in {result.seconds:7.2f} s "
                f"(CreateTopic median {result.median_create_s:.3f} s, max {result.slowest_create_s:.3f} s; "
                f"CPU broker {result.broker_cpu_s:.2f} s, coordinator {result.coordinator_cpu_s:.2f} s; "
                f"{result.produces} produces meanwhile, max {result.produce_max_ms:.1f} ms, "
                f"p99 {result.produce_p99_ms:.1f} ms)",
                flush=True,
            )
            results.append(result)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="0,5000,10000", help="existing partition counts to measure at")
    parser.add_argument("--topics", type=int, default=10, help="topics created per measurement")
    parser.add_argument("--partitions", type=int, default=100, help="partitions per created topic")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per level (median reported)")
    parser.add_argument("--tmpfs", action="store_true", help="data directory in /dev/shm")
    parser.add_argument("--name", default="partition_creation", help="results file name")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",") if x]
    results = run(levels, args.topics, args.partitions, args.rounds, "/dev/shm" if args.tmpfs else None)
    base = results[0].seconds
    print(
        "\n| existing partitions | create (s) | vs first | CreateTopic max (s) | broker CPU (s) "
        "| coordinator CPU (s) | produce max / p99 (ms) |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.existing:,} | {r.seconds:.2f} | {r.seconds / base:.2f}x | {r.slowest_create_s:.2f} "
            f"| {r.broker_cpu_s:.2f} | {r.coordinator_cpu_s:.2f} "
            f"| {r.produce_max_ms:.0f} / {r.produce_p99_ms:.0f} |"
        )
    save(
        args.name,
        {
            "topics": args.topics,
            "partitions_per_topic": args.partitions,
            "rounds": args.rounds,
            "data_dir": "tmpfs" if args.tmpfs else "disk",
            "levels": [r.__dict__ for r in results],
            "max_over_min": round(max(r.seconds for r in results) / min(r.seconds for r in results), 3),
        },
    )


if __name__ == "__main__":
    main()
