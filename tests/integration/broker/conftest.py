"""A real ``sluice broker`` process on loopback, driven through its gRPC stubs."""

from __future__ import annotations

import contextlib
import re
import threading
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from sluice.client.rpc import CHANNEL_OPTIONS, error_from_rpc
from sluice.codec.batch import BatchBuilder, Record, decode_records
from sluice.errors import SluiceError
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import broker_pb2_grpc, common_pb2
from tests.harness import ServiceProcess, start_service
from tests.wire_client import wire_address


def make_batch(
    values: Sequence[bytes], tags: Sequence[str | None] | str | None = None, ts: int = 1_000
) -> bytes:
    b = BatchBuilder()
    for i, value in enumerate(values):
        tag = tags if tags is None or isinstance(tags, str) else tags[i]
        b.append(value, None, tag, None, ts + i)
    return b.build()


def vals(n: int, prefix: str = "v", size: int = 0) -> list[bytes]:
    return [f"{prefix}{i}".encode().ljust(size, b".") for i in range(n)]


def records(part: pb.FetchPartitionResponse, start: int = 0) -> list[Record]:
    return decode_records(part.records, part.topic, part.partition, start)


@dataclass
class Broker:
    """A running broker process and a synchronous client for it."""

    proc: ServiceProcess
    data_dir: Path
    #: The harness thread reading the process output; joined before its pipe is closed.
    pumps: list[threading.Thread] = field(default_factory=list)
    channel: grpc.Channel = field(init=False)
    stub: broker_pb2_grpc.BrokerStub = field(init=False)

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(self.proc.address, options=CHANNEL_OPTIONS)
        self.stub = broker_pb2_grpc.BrokerStub(self.channel)

    @property
    def metrics_url(self) -> str:
        return f"http://{self.proc.metrics}/metrics"

    @property
    def wire_address(self) -> str:
        """The wire-protocol listener, from the ready line (``wire=host:port``)."""
        return wire_address(self.proc.output)

    def assign(
        self, topic: str, partitions: int = 1, topic_id: str = "id-1", full: bool = False, **config: int
    ) -> None:
        self.stub.UpdatePartitions(
            pb.UpdatePartitionsRequest(
                full=full,
                assign=[
                    pb.PartitionAssignment(
                        topic=topic, topic_id=topic_id, partition=p, config=pb.TopicConfig(**config)
                    )
                    for p in range(partitions)
                ],
            ),
            timeout=10,
        )

    def produce(
        self, topic: str, partition: int, *batches: bytes, acks: int = 1
    ) -> pb.ProducePartitionResponse:
        resp = self.stub.Produce(
            pb.ProduceRequest(
                acks=acks,
                partitions=[pb.ProducePartition(topic=topic, partition=partition, records=b"".join(batches))],
            ),
            timeout=10,
        )
        return resp.partitions[0]

    def fetch(
        self,
        *parts: pb.FetchPartition,
        max_wait_ms: int = 0,
        min_bytes: int = 1,
        max_bytes: int = 0,
        session_id: int = 0,
        epoch: int = -1,
        forgotten: Sequence[tuple[str, int]] = (),
        timeout: float = 40,
    ) -> pb.FetchResponse:
        return self.stub.Fetch(
            pb.FetchRequest(
                max_wait_ms=max_wait_ms,
                min_bytes=min_bytes,
                max_bytes=max_bytes,
                session_id=session_id,
                session_epoch=epoch,
                partitions=list(parts),
                forgotten=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in forgotten],
            ),
            timeout=timeout,
        )

    def fetch_one(
        self,
        topic: str,
        offset: int = 0,
        partition: int = 0,
        *,
        filter: str = "",
        partition_max_bytes: int = 0,
        max_bytes: int = 0,
        max_wait_ms: int = 0,
    ) -> pb.FetchPartitionResponse:
        resp = self.fetch(
            part(topic, offset, partition, partition_max_bytes, filter),
            max_bytes=max_bytes,
            max_wait_ms=max_wait_ms,
        )
        return resp.partitions[0]

    def offsets(self, topic: str, timestamp: int, partition: int = 0) -> pb.ListOffsetsPartitionResponse:
        resp = self.stub.ListOffsets(
            pb.ListOffsetsRequest(
                partitions=[pb.ListOffsetsPartition(topic=topic, partition=partition, timestamp=timestamp)]
            ),
            timeout=10,
        )
        return resp.partitions[0]

    def metric(self, name: str, **labels: str) -> float | None:
        text = urllib.request.urlopen(self.metrics_url, timeout=5).read().decode()
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            m = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
            if m and (not labels or ",".join(sorted((m.group(1) or "").split(","))) == want):
                return float(m.group(2))
        return None

    def alive(self) -> bool:
        return self.proc.process.poll() is None

    def close(self) -> None:
        self.channel.close()

    def reap(self) -> None:
        reap(self.proc, self.pumps)

    def kill(self) -> None:
        self.proc.kill()
        self.reap()

    def stop(self) -> int:
        self.close()
        code = self.proc.terminate()
        self.reap()
        return code


def part(topic: str, offset: int = 0, partition: int = 0, pmax: int = 0, flt: str = "") -> pb.FetchPartition:
    return pb.FetchPartition(
        topic=topic, partition=partition, fetch_offset=offset, partition_max_bytes=pmax, filter=flt
    )


def start_tracked(
    service: str, *args: str, nofile: tuple[int, int] | None = None
) -> tuple[ServiceProcess, list[threading.Thread]]:
    """``harness.start_service`` plus the thread pumping the process output (see :func:`reap`)."""
    before = set(threading.enumerate())
    proc = start_service(service, *args, nofile=nofile)
    return proc, [t for t in set(threading.enumerate()) - before if t.name.startswith("pump-")]


def reap(proc: ServiceProcess, pumps: list[threading.Thread]) -> None:
    """After the process ended: let its output pump reach EOF, then close the pipe.

    (The harness leaves the pipe open, which filterwarnings=error turns into a failure.)
    """
    for t in pumps:
        t.join(5)
    if proc.process.stdout is not None:
        proc.process.stdout.close()


def start_broker(
    data_dir: Path, *extra: str, flush: str = "interval", nofile: tuple[int, int] | None = None
) -> Broker:
    proc, pumps = start_tracked(
        "broker",
        "--port", "0",
        "--metrics-port", "0",
        "--data-dir", str(data_dir),
        "--broker-id", "1",
        "--flush", flush,
        *extra,
        nofile=nofile,
    )  # fmt: skip
    return Broker(proc, data_dir, pumps)


@contextlib.contextmanager
def running_broker(data_dir: Path, *extra: str, flush: str = "interval") -> Iterator[Broker]:
    broker = start_broker(data_dir, *extra, flush=flush)
    try:
        yield broker
    finally:
        was_running = broker.alive()
        code = broker.stop()
        assert code == 0 or not was_running, broker.proc.log()[-3000:]


@pytest.fixture(scope="package")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One shared broker (flush=interval) for tests that use their own topics."""
    with running_broker(
        tmp_path_factory.mktemp("broker"), "--max-wait", "5s", "--retention-check-interval", "200ms"
    ) as b:
        yield b


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name of this test's own."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:200]
    return f"{name}-{uuid.uuid4().hex[:6]}"


def rpc_error(exc: grpc.RpcError) -> SluiceError:
    return error_from_rpc(exc)
