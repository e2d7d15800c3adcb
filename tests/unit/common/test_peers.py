"""The peer layer's channel cache, refresh gate and backoff (no server needed: channels connect lazily)."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest

from sluice.common.backoff import PEER_INITIAL_S, PEER_MAX_S, Backoff
from sluice.common.peers import (
    PEER_CHANNEL_OPTIONS,
    AioPeers,
    AioRefreshGate,
    Peers,
    RefreshGate,
    is_routing,
)
from sluice.errors import (
    BrokerNotAvailable,
    InvalidArgument,
    NotCoordinator,
    NotLeader,
    SluiceError,
    UnknownTopicOrPartition,
)
from sluice.v1 import broker_pb2, broker_pb2_grpc, coordinator_pb2_grpc


def test_one_channel_and_one_stub_per_address() -> None:
    peers = Peers()
    try:
        stub = peers.stub("127.0.0.1:1", broker_pb2_grpc.BrokerStub)
        assert peers.stub("127.0.0.1:1", broker_pb2_grpc.BrokerStub) is stub
        assert peers.stub("127.0.0.1:2", broker_pb2_grpc.BrokerStub) is not stub
        coordinator = peers.stub("127.0.0.1:1", coordinator_pb2_grpc.CoordinatorStub)
        assert isinstance(coordinator, coordinator_pb2_grpc.CoordinatorStub)
        assert len(peers._cache.channels) == 2  # the coordinator stub shares 127.0.0.1:1's channel
    finally:
        peers.close()


def closed(stub: broker_pb2_grpc.BrokerStub) -> bool:
    try:
        stub.ListOffsets(broker_pb2.ListOffsetsRequest(), timeout=0.01)
    except ValueError:  # grpc: "Cannot invoke RPC on closed channel!"
        return True
    except grpc.RpcError:
        return False
    return False


def test_the_cache_is_bounded_and_evicts_the_least_recently_used() -> None:
    peers = Peers(max_peers=2)
    try:
        first = peers.stub("127.0.0.1:1", broker_pb2_grpc.BrokerStub)
        second = peers.stub("127.0.0.1:2", broker_pb2_grpc.BrokerStub)
        peers.stub("127.0.0.1:1", broker_pb2_grpc.BrokerStub)  # used again: 2 is now the oldest
        peers.stub("127.0.0.1:3", broker_pb2_grpc.BrokerStub)
        assert closed(second)
        assert not closed(first)
        again = peers.stub("127.0.0.1:2", broker_pb2_grpc.BrokerStub)
        assert again is not second  # a new channel when asked again
        assert not closed(again)
    finally:
        peers.close()
    assert closed(first)
    with pytest.raises(SluiceError, match="closed"):
        peers.stub("127.0.0.1:1", broker_pb2_grpc.BrokerStub)


def test_aio_cache_evicts_and_closes() -> None:
    async def main() -> None:
        peers = AioPeers(max_peers=1, retire_grace_s=0.1)
        first = peers.broker("127.0.0.1:1")
        assert peers.broker("127.0.0.1:1") is first
        peers.broker("127.0.0.1:2")  # evicts 1
        assert peers.broker("127.0.0.1:1") is not first
        peers.drop("127.0.0.1:1")
        await peers.close()
        with pytest.raises(SluiceError, match="closed"):
            peers.broker("127.0.0.1:1")

    asyncio.run(main())


def test_channels_reconnect_with_the_peer_backoff() -> None:
    options = dict(PEER_CHANNEL_OPTIONS)
    assert options["grpc.initial_reconnect_backoff_ms"] == PEER_INITIAL_S * 1000 == 100
    assert options["grpc.max_reconnect_backoff_ms"] == PEER_MAX_S * 1000 == 2000


def test_routing_errors() -> None:
    for routing in (NotLeader, NotCoordinator, UnknownTopicOrPartition, BrokerNotAvailable):
        assert is_routing(routing("x"))
    assert not is_routing(InvalidArgument("x"))
    assert not is_routing(SluiceError("x"))


def test_the_gate_refreshes_once_per_burst() -> None:
    calls = []
    started = threading.Event()

    def refresh() -> None:
        calls.append(1)
        started.set()
        time.sleep(0.05)  # callers arriving meanwhile wait for this one

    gate = RefreshGate(refresh)
    seen = gate.generation
    threads = [threading.Thread(target=gate.refresh_after, args=(seen,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert calls == [1]
    gate.refresh_after(seen)  # an error from a request planned before that refresh: nothing to do
    assert calls == [1]
    gate.refresh_after(gate.generation)  # planned after it: the metadata may be stale again
    assert calls == [1, 1]


def test_the_aio_gate_refreshes_once_per_burst() -> None:
    calls = []

    async def refresh() -> None:
        calls.append(1)
        await asyncio.sleep(0.01)

    async def main() -> None:
        gate = AioRefreshGate(refresh)
        seen = gate.generation
        await asyncio.gather(*(gate.refresh_after(seen) for _ in range(8)))
        assert calls == [1]
        await gate.refresh_after(gate.generation)
        assert calls == [1, 1]

    asyncio.run(main())


def test_a_failed_refresh_is_tried_again_by_the_next_error() -> None:
    outcomes = [BrokerNotAvailable("coordinator down"), None]

    def refresh() -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    gate = RefreshGate(refresh)
    with pytest.raises(BrokerNotAvailable):
        gate.refresh_after(0)
    gate.refresh_after(0)
    assert gate.generation == 1
    assert outcomes == []


def test_backoff_is_jittered_exponential_and_bounded() -> None:
    b = Backoff(jitter=False)
    assert [b.next() for _ in range(7)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    b.reset()
    assert b.next() == 0.1
    assert b.attempts == 1
    j = Backoff()
    waits = [j.next() for _ in range(7)]
    for wait, nominal in zip(waits, [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0], strict=True):
        assert nominal * 0.9 <= wait <= nominal
    with pytest.raises(ValueError, match="initial <= maximum"):
        Backoff(1.0, 0.5)
