"""What a push consumer costs the dispatcher in memory: RSS before and after N consumers (default 1,000).

Each scenario runs on a fresh stack (coordinator, broker, offset store, dispatcher, private Redis)
so that memory freed by one scenario cannot hide the next one's cost:

- ``grpc-shared``: N ``Consume`` streams on one gRPC channel (as one ``Client`` opens them), one
  Shared subscription;
- ``wire-shared``: N wire connections (one Consume stream each, as the SDK opens them), one Shared
  subscription;
- ``grpc-distinct`` / ``wire-distinct``: M subscriptions of one consumer each (default 200: each
  reads the backlog, so this is the costly one to run; the figure is per consumer, so it
  extrapolates to 1,000).

Besides RSS it reports where RSS grew (glibc's ``[heap]``, anonymous mappings such as pymalloc's
arenas) per consumer.

Every consumer sends what the SDK's push consumer sends (``tests/push_streams.py``): ``Subscribe``
(record batches, durable, from the earliest offset), ``Flow`` with its receiver queue (1,000
permits), and an ack for every batch. They are driven straight on the protocol from one asyncio
process, not through the SDK (1,000 SDK push consumers would be 2,000 threads in the bench
process); the dispatcher sees the same streams. The topic holds ``--backlog`` records, delivered before the
figures are taken (and acked), so the consumers have served traffic, not only subscribed.

The baseline is taken after one consumer of the same kind has subscribed (the subscription is
loaded, its partition feeds run), so the figure is what one more consumer costs:
``(RSS with N+1 - RSS with 1) / N``. ``--tracemalloc`` runs the dispatcher under tracemalloc and
prints where the memory of the N consumers went (by line), from a snapshot diff.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from _stack import save, stack

SCENARIOS = ("grpc-shared", "wire-shared", "grpc-distinct", "wire-distinct")
TOPIC = "mem"
#: Bounds each wait of the bench outside the consumers (seconds).
STEP_TIMEOUT = 120.0

# A sitecustomize for the dispatcher under --tracemalloc: SIGUSR1 writes a snapshot to the file
# SLUICE_BENCH_SNAPSHOT names (the counter in the name tells the two snapshots apart).
_SITECUSTOMIZE = """
import os, signal, tracemalloc
_n = [0]
def _dump(signum, frame):
    _n[0] += 1
    tracemalloc.take_snapshot().dump(os.environ["SLUICE_BENCH_SNAPSHOT"] + f".{_n[0]}")
    open(os.environ["SLUICE_BENCH_SNAPSHOT"] + f".{_n[0]}.done", "w").close()
if os.environ.get("SLUICE_BENCH_SNAPSHOT"):
    signal.signal(signal.SIGUSR1, _dump)
"""


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def rss_regions_kb(pid: int) -> dict[str, int]:
    """RSS by kind of mapping: glibc's ``[heap]`` (malloc), anonymous mappings (pymalloc's arenas,
    large mallocs, thread stacks) and the rest (code, libraries)."""
    regions = {"heap": 0, "anon": 0, "other": 0}
    kind = "other"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            first = line.split(maxsplit=6)
            if len(first) >= 5 and "-" in first[0] and ":" in first[3]:
                name = first[5].strip() if len(first) > 5 else ""
                kind = "heap" if name == "[heap]" else "anon" if not name else "other"
            elif line.startswith("Rss:"):
                regions[kind] += int(first[1])
    return regions


async def settle(pid: int, seconds: float) -> int:
    """RSS once the dispatcher's allocations have settled (the lowest of a few samples)."""
    samples = []
    for _ in range(max(1, int(seconds / 0.25))):
        await asyncio.sleep(0.25)
        samples.append(rss_kb(pid))
    return min(samples[len(samples) // 2 :])


async def snapshot(pid: int, path: str, n: int) -> None:
    """Signal the dispatcher to write snapshot ``n`` and wait for it (a file another process
    writes: nothing to wait on but the file)."""
    os.kill(pid, signal.SIGUSR1)
    done = Path(f"{path}.{n}.done")
    for _ in range(int(STEP_TIMEOUT / 0.1)):
        if await asyncio.to_thread(done.exists):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("the dispatcher wrote no tracemalloc snapshot")


async def scenario(
    name: str, n: int, backlog: int, grpc_address: str, wire_address: str, pid: int, snap: str | None
) -> dict[str, object]:
    from tests.push_streams import PushStreams  # importable once _stack has put the root on the path

    transport, kind = name.split("-")
    consumers = PushStreams(transport, TOPIC, grpc_address, wire_address)
    try:
        # The first consumer loads the subscription (and, for Shared, takes the backlog).
        await consumers.open(["s0"])
        await consumers.wait_received(backlog)
        before = await settle(pid, 2.0)
        regions_before = rss_regions_kb(pid)
        if snap:
            await snapshot(pid, snap, 1)
        started = time.monotonic()
        subs = [f"s{i + 1}" if kind == "distinct" else "s0" for i in range(n)]
        for i in range(0, n, 100):  # in steps, as consumers arrive in a real deployment
            await consumers.open(subs[i : i + 100])
        opened_s = time.monotonic() - started
        if kind == "distinct":  # each new subscription reads the backlog too
            await consumers.wait_received(backlog * (n + 1))
        # 24 s: a subscription frees what a burst left in its in-flight dicts every 5 s, once they
        # are empty, and the dispatcher gives free heap back to the system every 10 s (the figure is
        # the lowest sample of the last 12 s).
        after = await settle(pid, 24.0)
        regions_after = rss_regions_kb(pid)
        if snap:
            await snapshot(pid, snap, 2)
        return {
            "consumers": n,
            "records_received": consumers.received,
            "open_seconds": round(opened_s, 2),
            "rss_before_kb": before,
            "rss_after_kb": after,
            "kb_per_consumer": round((after - before) / n, 1),
            "kb_per_consumer_by_region": {
                k: round((regions_after[k] - regions_before[k]) / n, 1) for k in regions_after
            },
        }
    finally:
        await consumers.close()


def top_allocations(snap: str, limit: int = 25) -> list[str]:
    import tracemalloc

    first = tracemalloc.Snapshot.load(f"{snap}.1")
    second = tracemalloc.Snapshot.load(f"{snap}.2")
    stats = second.compare_to(first, "lineno")
    total = sum(s.size_diff for s in stats)
    return [f"total: {total / 1024:.0f} KiB"] + [str(s) for s in stats[:limit]]


@contextmanager
def traced_dispatcher(on: bool) -> Iterator[str | None]:
    """Under ``on``: the services start with tracemalloc and the snapshot hook (only the
    dispatcher is signalled)."""
    if not on:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="sluice-bench-tm-") as d:
        Path(d, "sitecustomize.py").write_text(_SITECUSTOMIZE)
        saved = dict(os.environ)
        os.environ["PYTHONPATH"] = d + os.pathsep + os.environ.get("PYTHONPATH", "")
        os.environ["PYTHONTRACEMALLOC"] = "1"
        os.environ["SLUICE_BENCH_SNAPSHOT"] = str(Path(d, "snap"))
        try:
            yield str(Path(d, "snap"))
        finally:
            os.environ.clear()
            os.environ.update(saved)


def run(name: str, n: int, backlog: int, trace: bool) -> dict[str, object]:
    from sluice import Client

    with traced_dispatcher(trace) as snap, stack(push=True) as s:
        dispatcher = s.extra[-1]
        with Client(s.bootstrap) as client:
            client.admin.create_topic(TOPIC, partitions=4)
            if backlog:
                producer = client.producer(TOPIC)
                for i in range(backlog):
                    producer.send(b"x" * 100, key=str(i).encode())
                producer.flush()
                producer.close()
            deadline = time.monotonic() + STEP_TIMEOUT
            while not (info := client.metadata(refresh=True).dispatchers) and time.monotonic() < deadline:
                time.sleep(0.1)
            wire = next(iter(info.values())).wire_address
        assert wire is not None, "the dispatcher serves no wire port"
        result = asyncio.run(
            scenario(name, n, backlog, dispatcher.address, wire, dispatcher.process.pid, snap)
        )
        if snap:
            result["tracemalloc_top"] = top_allocations(snap)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--consumers", type=int, default=1000, help="consumers of the shared scenarios")
    parser.add_argument(
        "--distinct-consumers",
        type=int,
        default=200,
        help="subscriptions of the distinct scenarios (each reads the backlog: small on a shared machine)",
    )
    parser.add_argument("--backlog", type=int, default=1000, help="records on the topic before the consumers")
    parser.add_argument("--scenario", choices=SCENARIOS, action="append", help="default: all")
    parser.add_argument("--tracemalloc", action="store_true", help="where the memory went (slower)")
    args = parser.parse_args()
    # 1,000 wire consumers are 1,000 descriptors here and in the dispatcher (which inherits this).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    results: dict[str, object] = {}
    for name in args.scenario or SCENARIOS:
        n = args.distinct_consumers if name.endswith("distinct") else args.consumers
        results[name] = run(name, n, args.backlog, args.tracemalloc)
        print(name, results[name], flush=True)
    rows = [f"{'scenario':<15} {'consumers':>9} {'KB/consumer':>12} {'RSS before':>11} {'RSS after':>10}"]
    for name, r in results.items():
        assert isinstance(r, dict)
        rows.append(
            f"{name:<15} {r['consumers']:>9} {r['kb_per_consumer']:>12} "
            f"{r['rss_before_kb'] // 1024:>8} MB {r['rss_after_kb'] // 1024:>7} MB"
        )
    print("\n".join(rows))
    save("push_consumers_memory", results)


if __name__ == "__main__":
    main()
