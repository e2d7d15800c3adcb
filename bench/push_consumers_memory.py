"""What a push consumer costs the dispatcher in memory: RSS before and after N consumers (default 1,000).

Each scenario runs on a fresh stack (coordinator, broker, offset store, dispatcher, private Redis)
so that memory freed by one scenario cannot hide the next one's cost:

- ``grpc-shared``: N ``Consume`` streams on one gRPC channel (as one ``Client`` opens them), one
  Shared subscription;
- ``wire-shared``: N wire connections (one Consume stream each, as the SDK opens them), one Shared
  subscription;
- ``grpc-distinct`` / ``wire-distinct``: N subscriptions of one consumer each.

Every consumer sends what the SDK's push consumer sends: ``Subscribe`` (record batches, durable,
from the earliest offset), then ``Flow`` with its receiver queue (1,000 permits), and waits for
``Subscribed``. The consumers are driven straight on the protocol from one asyncio process, not
through the SDK (1,000 SDK push consumers would be 2,000 threads in the bench process); the
dispatcher sees the same streams. The topic holds ``--backlog`` records, delivered before the
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
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _stack import save, stack

SCENARIOS = ("grpc-shared", "wire-shared", "grpc-distinct", "wire-distinct")
TOPIC = "mem"
PERMITS = 1000
#: Bounds every wait of the bench (seconds).
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


def subscribe_command(subscription: str, consumer: int) -> bytes:
    from sluice.v1 import dispatcher_pb2 as pb

    return pb.ConsumerCommand(
        subscribe=pb.Subscribe(
            topic=TOPIC,
            subscription=subscription,
            type=pb.SUBSCRIPTION_TYPE_SHARED,
            consumer_name=f"c{consumer}",
            consumer_id=f"bench-{consumer}-{os.getpid()}",
            initial_position=pb.INITIAL_POSITION_EARLIEST,
            durable=True,
            record_batches=True,
        )
    ).SerializeToString()


def flow_command() -> bytes:
    from sluice.v1 import dispatcher_pb2 as pb

    return pb.ConsumerCommand(flow=pb.Flow(permits=PERMITS)).SerializeToString()


def ack_command(batch: Any) -> tuple[int, bytes | None]:
    """How many records a MessageBatch holds, and the ack of all of them (by ranges, as the SDK acks)."""
    from sluice.codec.batch import batch_views
    from sluice.v1 import dispatcher_pb2 as pb

    count = 0
    ranges = []
    for entry in batch.batches:
        bounds: list[int] = []
        for view in batch_views(entry.records):
            for offset in view.offsets:
                bounds += [offset, offset + 1]
        count += len(bounds) // 2
        if bounds:
            ranges.append(pb.OffsetRanges(partition=entry.partition, bounds=bounds))
    if not ranges:
        return count, None
    return count, pb.ConsumerCommand(ack=pb.Ack(ranges=ranges)).SerializeToString()


class Consumers:
    """N consumers on one transport; ``received`` counts the records delivered to them."""

    def __init__(self, transport: str, grpc_address: str, wire_address: str) -> None:
        self.transport = transport
        self.grpc_address = grpc_address
        self.wire_address = wire_address
        self.received = 0
        self.tasks: list[asyncio.Task[None]] = []
        self.subscribed = 0
        self._channel: Any = None
        self._ready = asyncio.Event()
        self._want = 0

    async def open(self, subscriptions: list[str]) -> None:
        """One consumer per entry of ``subscriptions``; returns when all are subscribed."""
        self._want += len(subscriptions)
        self._ready.clear()
        first = len(self.tasks)
        for i, sub in enumerate(subscriptions):
            run = self._grpc if self.transport == "grpc" else self._wire
            self.tasks.append(asyncio.create_task(run(sub, first + i)))
        await asyncio.wait_for(self._ready.wait(), STEP_TIMEOUT)

    def _subscribed(self) -> None:
        self.subscribed += 1
        if self.subscribed >= self._want:
            self._ready.set()

    def _count(self, event: Any) -> bytes | None:
        n, ack = ack_command(event.messages)
        self.received += n
        return ack

    async def _grpc(self, subscription: str, n: int) -> None:
        from grpc import aio

        from sluice.v1 import dispatcher_pb2 as pb
        from sluice.v1 import dispatcher_pb2_grpc

        if self._channel is None:
            self._channel = aio.insecure_channel(self.grpc_address)
        stub = dispatcher_pb2_grpc.DispatcherStub(self._channel)
        call = stub.Consume()
        await call.write(pb.ConsumerCommand.FromString(subscribe_command(subscription, n)))
        await call.write(pb.ConsumerCommand.FromString(flow_command()))
        while isinstance(event := await call.read(), pb.DispatcherEvent):
            kind = event.WhichOneof("event")
            if kind == "subscribed":
                self._subscribed()
            elif kind == "messages":
                ack = self._count(event)
                if ack is not None:
                    await call.write(pb.ConsumerCommand.FromString(ack))
            elif kind == "error":
                raise RuntimeError(f"consumer {n}: {event.error}")

    async def _wire(self, subscription: str, n: int) -> None:
        from sluice.common.wire import HEADER, FrameReader, FrameType, split_address
        from sluice.v1 import dispatcher_pb2 as pb
        from sluice.v1 import wire_pb2

        reader, writer = await asyncio.open_connection(*split_address(self.wire_address))

        def send(kind: int, payload: bytes) -> None:
            writer.write(HEADER.pack(len(payload) + 1, kind) + payload)

        send(FrameType.HELLO, wire_pb2.WireHello(version=1, client_id=f"c{n}").SerializeToString())
        send(FrameType.CONSUME, subscribe_command(subscription, n))
        send(FrameType.CONSUME, flow_command())
        frames = FrameReader()
        try:
            while data := await reader.read(1 << 16):
                for kind, payload in frames.feed(data):
                    if kind != FrameType.CONSUME:
                        continue
                    event = pb.DispatcherEvent.FromString(payload)
                    which = event.WhichOneof("event")
                    if which == "subscribed":
                        self._subscribed()
                    elif which == "messages":
                        ack = self._count(event)
                        if ack is not None:
                            send(FrameType.CONSUME, ack)
                    elif which == "error":
                        raise RuntimeError(f"consumer {n}: {event.error}")
        finally:
            writer.close()

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()


async def settle(pid: int, seconds: float) -> int:
    """RSS once the dispatcher's allocations have settled (the lowest of a few samples)."""
    samples = []
    for _ in range(max(1, int(seconds / 0.25))):
        await asyncio.sleep(0.25)
        samples.append(rss_kb(pid))
    return min(samples[len(samples) // 2 :])


async def snapshot(pid: int, path: str, n: int) -> None:
    os.kill(pid, signal.SIGUSR1)
    done = Path(f"{path}.{n}.done")
    deadline = time.monotonic() + STEP_TIMEOUT
    while not done.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the dispatcher wrote no tracemalloc snapshot")
        await asyncio.sleep(0.1)


async def scenario(
    name: str, n: int, backlog: int, grpc_address: str, wire_address: str, pid: int, snap: str | None
) -> dict[str, object]:
    transport, kind = name.split("-")
    consumers = Consumers(transport, grpc_address, wire_address)
    try:
        # The first consumer loads the subscription (and, for Shared, takes the backlog).
        await consumers.open(["s0"])
        deadline = time.monotonic() + STEP_TIMEOUT
        while consumers.received < backlog and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        before = await settle(pid, 2.0)
        if snap:
            await snapshot(pid, snap, 1)
        started = time.monotonic()
        subs = [f"s{i + 1}" if kind == "distinct" else "s0" for i in range(n)]
        for i in range(0, n, 100):  # in steps, as consumers arrive in a real deployment
            await consumers.open(subs[i : i + 100])
        opened_s = time.monotonic() - started
        if kind == "distinct":  # each new subscription reads the backlog too
            deadline = time.monotonic() + STEP_TIMEOUT
            while consumers.received < backlog * (n + 1) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        after = await settle(pid, 3.0)
        if snap:
            await snapshot(pid, snap, 2)
        return {
            "consumers": n,
            "records_received": consumers.received,
            "open_seconds": round(opened_s, 2),
            "rss_before_kb": before,
            "rss_after_kb": after,
            "kb_per_consumer": round((after - before) / n, 1),
        }
    finally:
        await consumers.close()


def top_allocations(snap: str, limit: int = 25) -> list[str]:
    import tracemalloc

    first = tracemalloc.Snapshot.load(f"{snap}.1")
    second = tracemalloc.Snapshot.load(f"{snap}.2")
    stats = second.compare_to(first, "lineno")
    return [str(s) for s in stats[:limit]]


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
    parser.add_argument("--consumers", type=int, default=1000)
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
        results[name] = run(name, args.consumers, args.backlog, args.tracemalloc)
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
    sys.exit(main())
