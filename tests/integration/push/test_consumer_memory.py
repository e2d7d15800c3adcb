"""What a push consumer costs the dispatcher (issue 20): under 64 KB of RSS each, on both transports.

The smoke version of ``bench/push_consumers_memory.py`` (which opens 1,000): 100 consumers of one
Shared subscription, driven on the protocol (``tests/push_streams.py``), on a cluster of this
module's own so nothing else moves the dispatcher's memory meanwhile. The figure is the RSS the
100 add, after one consumer has loaded the subscription. It was ~270 KB per wire consumer when
every wire connection allocated a 256 KiB read buffer; it is ~30 KB now on either transport
(``docs/dispatcher.md``, "What a consumer costs"), so 64 KB leaves room for the noise of RSS.

Large frames still pass on connections whose read buffer starts small: records of ~900 KB are
produced (the broker's buffer grows for them and shrinks between them) and pushed, and 1 MiB
consume frames reach the dispatcher's core around a small one.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from sluice import Client
from sluice.v1 import dispatcher_pb2 as pb
from tests.integration.push.conftest import PushCluster, run_push_cluster
from tests.integration.push.helpers import drain, produce
from tests.push_streams import PushStreams, subscribe

CONSUMERS = 100
LIMIT_KB = 64
BACKLOG = 100


@pytest.fixture(scope="module")
def quiet_cluster() -> Iterator[PushCluster]:
    with run_push_cluster() as c:
        yield c


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


async def _settled_rss(pid: int) -> int:
    """The lowest of a few samples over a second: what stays, not a passing allocation."""
    samples = []
    for _ in range(5):
        await asyncio.sleep(0.2)
        samples.append(_rss_kb(pid))
    return min(samples)


async def _lowest_rss(pid: int, seconds: float) -> int:
    samples = []
    for _ in range(int(seconds / 0.5)):
        await asyncio.sleep(0.5)
        samples.append(_rss_kb(pid))
    return min(samples)


def _wire_address(client: Client) -> str:
    (info,) = client.metadata(refresh=True).dispatchers.values()
    assert info.wire_address is not None, "the dispatcher serves no wire port"
    return info.wire_address


def _padded(command: pb.ConsumerCommand, size: int) -> bytes:
    """``command`` in ``size`` bytes: a field the dispatcher does not know (number 1000,
    length-delimited) pads it, and parsing skips it."""
    encoded = command.SerializeToString()
    tag = bytes([0xC2, 0x3E])  # (1000 << 3) | 2 as a varint
    body = size - len(encoded) - len(tag) - 3
    assert 0 <= body < 1 << 21
    length = bytes([(body & 0x7F) | 0x80, ((body >> 7) & 0x7F) | 0x80, body >> 14])
    return encoded + tag + length + b"\0" * body


@pytest.mark.parametrize("transport", ["wire", "grpc"])
def test_a_hundred_push_consumers_cost_the_dispatcher_under_64_kb_each(
    quiet_cluster: PushCluster, transport: str
) -> None:
    topic = f"mem-{uuid.uuid4().hex[:8]}"
    with Client(quiet_cluster.bootstrap, request_timeout=10) as client:
        client.admin.create_topic(topic, partitions=4)
        produce(client, topic, BACKLOG)
        wire = _wire_address(client)
    pid = quiet_cluster.dispatcher.process.pid

    async def measure() -> float:
        streams = PushStreams(transport, topic, quiet_cluster.dispatcher.address, wire)
        try:
            await streams.open(["shared"])
            await streams.wait_received(BACKLOG)
            before = await _settled_rss(pid)
            await streams.open(["shared"] * CONSUMERS)
            after = await _settled_rss(pid)
            if transport == "wire":
                # 1 MiB frames around a small one, on a connection whose buffer started at 16 KiB
                # (grows, shrinks, grows): each is read whole and reaches the core, which answers
                # the second Subscribe of a stream with an Error event and keeps the stream.
                streams.collect_errors = True
                again = subscribe(topic, "shared", 0)
                for size in (1 << 20, 200, 1 << 20):
                    streams.send_raw(0, _padded(again, size))
                await streams.wait_errors(3)
                assert all("already subscribed" in e for e in streams.errors), streams.errors
            return (after - before) / CONSUMERS
        finally:
            await streams.close()

    per_consumer_kb = asyncio.run(measure())
    assert per_consumer_kb < LIMIT_KB, f"{per_consumer_kb:.1f} KB of dispatcher RSS per {transport} consumer"


#: Records each subscription of its own reads and acknowledges before the figure is taken.
OWN_BACKLOG = 1000


def test_a_hundred_subscriptions_of_their_own_cost_the_dispatcher_under_64_kb_each(
    quiet_cluster: PushCluster,
) -> None:
    """A consumer with a subscription of its own, after it took (and acked) a backlog of 1,000
    records: it cost 160-200 KB before issue 20's work on it (the last Ack by ranges kept alive
    with its upb arena, ~40 KB of C memory; the heap a burst freed kept by glibc; per-partition
    containers), ~40 KB now (docs/dispatcher.md, "What a subscription costs")."""
    topic = f"own-{uuid.uuid4().hex[:8]}"
    with Client(quiet_cluster.bootstrap, request_timeout=10) as client:
        client.admin.create_topic(topic, partitions=4)
        produce(client, topic, OWN_BACKLOG)
        wire = _wire_address(client)
    pid = quiet_cluster.dispatcher.process.pid

    async def measure() -> float:
        streams = PushStreams("wire", topic, quiet_cluster.dispatcher.address, wire)
        try:
            await streams.open(["own-0"])
            await streams.wait_received(OWN_BACKLOG)
            before = await _settled_rss(pid)
            await streams.open([f"own-{i + 1}" for i in range(CONSUMERS)])
            await streams.wait_received(OWN_BACKLOG * (CONSUMERS + 1))
            # The subscriptions give back their in-flight tables every 5 s and the dispatcher
            # its free heap every 10 s: the figure is what stays after both (the lowest sample
            # of 24 s; under load the last acks arrive late, and the timers start from them).
            after = await _lowest_rss(pid, 24.0)
            return (after - before) / CONSUMERS
        finally:
            await streams.close()

    per_consumer_kb = asyncio.run(measure())
    assert per_consumer_kb < LIMIT_KB, f"{per_consumer_kb:.1f} KB of dispatcher RSS per subscription"


def test_large_records_pass_through_buffers_that_grow_and_shrink(quiet_cluster: PushCluster) -> None:
    """~900 KB records between small ones: the broker's read buffer grows for each large produce
    frame and shrinks for the small ones; every record arrives whole at a push consumer."""
    topic = f"big-{uuid.uuid4().hex[:8]}"
    values = [bytes([i]) * (900 * 1024) if i % 2 == 0 else b"small-%d" % i for i in range(6)]
    with Client(quiet_cluster.bootstrap, request_timeout=10) as client:
        client.admin.create_topic(topic, partitions=1)
        with client.producer(topic, linger=0) as producer:
            for v in values:
                producer.send(v).result(timeout=20)
        pc = client.push_consumer(topic, "big", "exclusive", initial_position="earliest")
        try:
            got = [m.value for m in drain(pc, len(values))]
        finally:
            pc.close()
    assert got == values
