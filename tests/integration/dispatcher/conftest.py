"""A real cluster on loopback: Redis, offset store, coordinator, broker and dispatcher processes.

Tests drive the dispatcher's Consume stream with the generated gRPC stubs directly (``StreamClient``),
so every assertion is about what goes over the wire.
"""

from __future__ import annotations

import contextlib
import queue
import re
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from sluice.client.rpc import CHANNEL_OPTIONS
from sluice.codec.batch import BatchBuilder, Record, decode_records
from sluice.v1 import (
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    dispatcher_pb2_grpc,
)
from sluice.v1 import dispatcher_pb2 as pb
from tests.harness import RedisServer, ServiceProcess, run_redis, start_service


def close_output(sp: ServiceProcess) -> None:
    """Close the harness's pipe once its reader thread is done (else a ResourceWarning)."""
    for thread in threading.enumerate():
        if thread.name == f"pump-{sp.service}":
            thread.join(5)
    if sp.process.stdout is not None:
        sp.process.stdout.close()


def stop(sp: ServiceProcess) -> None:
    sp.terminate()
    close_output(sp)


class StreamClient:
    """One Consume stream, driven synchronously: send commands, read events with timeouts."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._requests: queue.Queue[pb.ConsumerCommand | None] = queue.Queue()
        self.events: queue.Queue[pb.DispatcherEvent | None] = queue.Queue()
        stub = dispatcher_pb2_grpc.DispatcherStub(channel)
        self._call: Any = stub.Consume(iter(self._requests.get, None))
        self.ended = threading.Event()
        self.end_error: grpc.RpcError | None = None
        #: The largest number of messages seen in one MessageBatch.
        self.max_batch = 0
        self.active: dict[int, bool] = {}
        self.errors: list[common_pb2.Error] = []
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            for ev in self._call:
                self.events.put(ev)
        except grpc.RpcError as exc:
            self.end_error = exc
        finally:
            self.ended.set()
            self.events.put(None)

    def send(self, cmd: pb.ConsumerCommand) -> None:
        self._requests.put(cmd)

    def subscribe(self, topic: str, subscription: str, **kw: Any) -> StreamClient:
        self.send(pb.ConsumerCommand(subscribe=pb.Subscribe(topic=topic, subscription=subscription, **kw)))
        return self

    def flow(self, permits: int) -> None:
        self.send(pb.ConsumerCommand(flow=pb.Flow(permits=permits)))

    def ack(self, ids: Iterable[tuple[int, int]], cumulative: bool = False) -> None:
        self.send(
            pb.ConsumerCommand(
                ack=pb.Ack(ids=[pb.MessageId(partition=p, offset=o) for p, o in ids], cumulative=cumulative)
            )
        )

    def nack(self, ids: Iterable[tuple[int, int]]) -> None:
        self.send(pb.ConsumerCommand(nack=pb.Nack(ids=[pb.MessageId(partition=p, offset=o) for p, o in ids])))

    def next_event(self, timeout: float = 10) -> pb.DispatcherEvent | None:
        """The next event (None: the stream ended). Raises queue.Empty on timeout."""
        ev = self.events.get(timeout=timeout)
        if ev is not None:
            kind = ev.WhichOneof("event")
            if kind == "messages":
                self.max_batch = max(self.max_batch, len(ev.messages.messages))
            elif kind == "active_change":
                self.active[ev.active_change.partition] = ev.active_change.is_active
            elif kind == "error":
                self.errors.append(ev.error)
        return ev

    def expect_subscribed(self, timeout: float = 15) -> None:
        ev = self.next_event(timeout)
        assert ev is not None, f"stream ended: {self.end_error}"
        assert ev.WhichOneof("event") == "subscribed", ev

    def expect_error(self, code: int, timeout: float = 10) -> common_pb2.Error:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ev = self.next_event(max(deadline - time.monotonic(), 0.01))
            assert ev is not None, "stream ended before the error"
            if ev.WhichOneof("event") == "error":
                assert ev.error.code == code, ev.error
                return ev.error
        raise AssertionError("no error event")

    def receive(self, n: int, timeout: float = 15) -> list[pb.PushedMessage]:
        """Exactly ``n`` messages (more arriving in the same batch are returned too)."""
        out: list[pb.PushedMessage] = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"received {len(out)} of {n} messages")
            try:
                ev = self.next_event(left)
            except queue.Empty:
                continue
            assert ev is not None, f"stream ended after {len(out)} messages: {self.end_error}"
            if ev.WhichOneof("event") == "messages":
                out.extend(ev.messages.messages)
            elif ev.WhichOneof("event") == "error":
                raise AssertionError(f"error event: {ev.error}")
        return out

    def quiet(self, seconds: float) -> list[pb.PushedMessage]:
        """Messages arriving within ``seconds`` (expected: none)."""
        out: list[pb.PushedMessage] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                ev = self.next_event(left)
            except queue.Empty:
                break
            if ev is None:
                break
            if ev.WhichOneof("event") == "messages":
                out.extend(ev.messages.messages)
        return out

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()
        self._thread.join(5)


def ids(msgs: Iterable[pb.PushedMessage]) -> list[tuple[int, int]]:
    return [(m.id.partition, m.id.offset) for m in msgs]


@dataclass
class Cluster:
    redis: RedisServer
    data_dir: Path
    offset_store: ServiceProcess
    coordinator: ServiceProcess
    broker: ServiceProcess
    dispatcher: ServiceProcess
    dispatcher_args: list[str]
    channels: list[grpc.Channel] = field(default_factory=list)
    streams: list[StreamClient] = field(default_factory=list)

    def channel(self, address: str) -> grpc.Channel:
        ch = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.channels.append(ch)
        return ch

    @property
    def coord(self) -> coordinator_pb2_grpc.CoordinatorStub:
        return coordinator_pb2_grpc.CoordinatorStub(self.channel(self.coordinator.address))

    @property
    def dispatcher_stub(self) -> dispatcher_pb2_grpc.DispatcherStub:
        return dispatcher_pb2_grpc.DispatcherStub(self.channel(self.dispatcher.address))

    def create_topic(self, name: str, partitions: int = 1) -> None:
        self.coord.CreateTopic(
            coordinator_pb2.CreateTopicRequest(name=name, partitions=partitions), timeout=15
        )

    def produce(
        self,
        topic: str,
        partition: int,
        values: list[bytes],
        keys: list[bytes | None] | None = None,
        tags: list[str | None] | None = None,
        headers: dict[str, bytes] | None = None,
        timestamp: int | None = None,
    ) -> int:
        b = BatchBuilder()
        for i, v in enumerate(values):
            ts = timestamp if timestamp is not None else 1000 + i
            b.append(v, keys[i] if keys else None, tags[i] if tags else None, headers, ts)
        stub = broker_pb2_grpc.BrokerStub(self.channel(self.broker.address))
        resp = stub.Produce(
            broker_pb2.ProduceRequest(
                acks=1,
                timeout_ms=10_000,
                partitions=[broker_pb2.ProducePartition(topic=topic, partition=partition, records=b.build())],
            ),
            timeout=15,
        )
        part = resp.partitions[0]
        assert part.error.code == common_pb2.NONE, part.error
        return part.base_offset

    def read_all(self, topic: str, partition: int = 0) -> list[Record]:
        stub = broker_pb2_grpc.BrokerStub(self.channel(self.broker.address))
        resp = stub.Fetch(
            broker_pb2.FetchRequest(
                max_wait_ms=0,
                session_epoch=-1,
                partitions=[broker_pb2.FetchPartition(topic=topic, partition=partition, fetch_offset=0)],
            ),
            timeout=15,
        )
        part = resp.partitions[0]
        assert part.error.code == common_pb2.NONE, part.error
        return decode_records(part.records, topic, partition)

    def stream(self, address: str | None = None) -> StreamClient:
        s = StreamClient(self.channel(address or self.dispatcher.address))
        self.streams.append(s)
        return s

    def consumer(self, topic: str, subscription: str, **kw: object) -> StreamClient:
        kw.setdefault("consumer_id", f"{subscription}-{len(self.streams)}")
        s = self.stream().subscribe(topic, subscription, **kw)
        s.expect_subscribed()
        return s

    def describe(self, topic: str, subscription: str) -> pb.DescribeSubscriptionResponse:
        return self.dispatcher_stub.DescribeSubscription(
            pb.DescribeSubscriptionRequest(topic=topic, subscription=subscription), timeout=10
        )

    def metric(self, name: str, **labels: str) -> float:
        text = urllib.request.urlopen(f"http://{self.dispatcher.metrics}/metrics", timeout=10).read().decode()
        total = 0.0
        found = False
        for line in text.splitlines():
            if not line.startswith(name):
                continue
            m = re.match(r"([a-z_]+)(\{[^}]*\})? (\S+)", line)
            if not m or m.group(1) != name:
                continue
            lab = m.group(2) or ""
            if all(f'{k}="{v}"' in lab for k, v in labels.items()):
                total += float(m.group(3))
                found = True
        return total if found else 0.0

    def wait_flushed(self, topic: str, subscription: str, timeout: float = 10) -> None:
        """Until the subscription's cursors are all in the offset store."""
        deadline = time.monotonic() + timeout
        while self.metric("sluice_dispatcher_cursors_dirty", topic=topic, subscription=subscription) > 0:
            assert time.monotonic() < deadline, "cursors never flushed"
            time.sleep(0.05)

    def restart_dispatcher(self, kill: bool = True) -> None:
        """kill -9 (the streams notice only afterwards, as in a crash) or SIGTERM, then start again."""
        if kill:
            self.dispatcher.kill()
            close_output(self.dispatcher)
        for s in self.streams:
            s.close()
        self.streams.clear()
        if not kill:
            stop(self.dispatcher)
        self.dispatcher = start_service("dispatcher", *self.dispatcher_args)

    def close(self) -> None:
        for s in self.streams:
            s.close()
        for ch in self.channels:
            ch.close()
        code = self.dispatcher.terminate()
        close_output(self.dispatcher)
        for sp in (self.broker, self.coordinator, self.offset_store):
            with contextlib.suppress(Exception):
                stop(sp)
        log = self.dispatcher.log()
        assert code == 0, f"the dispatcher did not stop cleanly ({code}):\n{log[-3000:]}"
        assert "Traceback" not in log, log[-5000:]


def wait_until(pred: Callable[[], object], timeout: float = 10, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@contextlib.contextmanager
def run_cluster(*dispatcher_extra: str) -> Iterator[Cluster]:
    with run_redis() as redis_server, tempfile.TemporaryDirectory(prefix="sluice-dispatcher-") as d:
        procs: list[ServiceProcess] = []
        try:
            store = start_service(
                "offset-store", "--port", "0", "--metrics-port", "0", "--redis-url", redis_server.url
            )
            procs.append(store)
            coord = start_service(
                "coordinator",
                "--port",
                "0",
                "--metrics-port",
                "0",
                "--redis-url",
                redis_server.url,
                "--offset-store",
                store.address,
            )
            procs.append(coord)
            broker = start_service(
                "broker",
                "--broker-id",
                "0",
                "--port",
                "0",
                "--metrics-port",
                "0",
                "--data-dir",
                str(Path(d) / "broker"),
                "--coordinator",
                coord.address,
            )
            procs.append(broker)
            dargs = [
                "--dispatcher-id",
                "d1",
                "--port",
                "0",
                "--metrics-port",
                "0",
                "--coordinator",
                coord.address,
                *dispatcher_extra,
            ]
            disp = start_service("dispatcher", *dargs)
            procs.append(disp)
        except BaseException:
            for p in procs:
                with contextlib.suppress(Exception):
                    stop(p)
            raise
        cluster = Cluster(redis_server, Path(d), store, coord, broker, disp, dargs)
        try:
            wait_broker_registered(cluster)
            yield cluster
        finally:
            cluster.close()


def wait_broker_registered(cluster: Cluster) -> None:
    def ready() -> bool:
        md = cluster.coord.Metadata(coordinator_pb2.MetadataRequest(), timeout=10)
        return any(b.alive for b in md.brokers) and any(x.alive for x in md.dispatchers)

    wait_until(ready, 20, "broker and dispatcher registration")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with run_cluster() as c:
        yield c
