"""The peer layer: the one cache of gRPC channels to brokers, dispatchers, the coordinator and the offset
store, and the one rule for refreshing metadata after a routing error.

- :class:`Peers` (the SDK's threads) and :class:`AioPeers` (a service's event loop) keep one channel per
  address, and one stub of each kind on it. At most ``max_peers`` addresses: past that the least recently
  used channel is closed, so addresses that come and go (a broker restarted on a new port) cannot pile up
  channels. ``close()`` closes them all. No other module creates a gRPC channel (a test checks it).
  Only stubs leave the cache, never a channel: grpc crashes the process (SIGSEGV, grpcio 1.6x) when a stub
  is built on a closed channel, so stubs are built here, under the lock, on a channel known open.
- Every channel reconnects with the one backoff (``sluice.common.backoff``): gRPC's own reconnect timer
  set to :data:`PEER_CHANNEL_OPTIONS`, 100 ms doubling to 2 s instead of gRPC's 1 s to 120 s.
- :class:`RefreshGate` / :class:`AioRefreshGate` run the caller's metadata refresh after routing errors
  (:data:`ROUTING_ERRORS`) once per burst: a caller notes the gate's generation when it plans a request,
  and a routing error refreshes only if no refresh finished since; concurrent callers share one refresh.

docs/architecture.md ("Peer layer") has the numbers and the reasons.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import grpc
from grpc import aio

from sluice.common.backoff import PEER_INITIAL_S, PEER_MAX_S
from sluice.common.client_interceptors import TokenInterceptor, aio_token_interceptors
from sluice.common.client_security import ClientSecurity, process_security
from sluice.common.client_tls import channel_credentials, channel_options
from sluice.common.rpc import CHANNEL_OPTIONS
from sluice.errors import (
    BrokerNotAvailable,
    FencedLeaderEpoch,
    NotCoordinator,
    NotLeader,
    OffsetNotAvailable,
    SluiceError,
    UnknownLeaderEpoch,
    UnknownTopicOrPartition,
)
from sluice.v1 import (
    acl_pb2_grpc,
    broker_pb2_grpc,
    coordinator_pb2_grpc,
    offset_store_pb2_grpc,
    quota_pb2_grpc,
)

__all__ = [
    "MAX_PEERS",
    "PEER_CHANNEL_OPTIONS",
    "ROUTING_ERRORS",
    "AioPeers",
    "AioRefreshGate",
    "Peers",
    "RefreshGate",
    "is_routing",
]

S = TypeVar("S")
C = TypeVar("C")

#: gRPC's reconnect timer on every peer channel: the peer layer's backoff numbers.
PEER_CHANNEL_OPTIONS = (
    *CHANNEL_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", int(PEER_INITIAL_S * 1000)),
    ("grpc.min_reconnect_backoff_ms", int(PEER_INITIAL_S * 1000)),
    ("grpc.max_reconnect_backoff_ms", int(PEER_MAX_S * 1000)),
)

#: Channels one cache keeps open at most. A cluster has far fewer brokers; the bound only stops churn.
MAX_PEERS = 256

#: Errors that mean "the metadata is stale: ask the coordinator where things are now, then retry".
#: BrokerNotAvailable is one too: the peer may be down for good and its partitions moved elsewhere.
#: The leader-epoch errors (KIP-320) mean a leader change this client or that broker has not seen yet;
#: OFFSET_NOT_AVAILABLE, a new leader whose HW has not caught up: the refresh is cheap and the retry is
#: what they need (docs/replication.md, "Consumers across a failover").
ROUTING_ERRORS: tuple[type[SluiceError], ...] = (
    NotLeader,
    NotCoordinator,
    UnknownTopicOrPartition,
    BrokerNotAvailable,
    FencedLeaderEpoch,
    UnknownLeaderEpoch,
    OffsetNotAvailable,
)


def is_routing(error: BaseException) -> bool:
    """Whether a metadata refresh and another try can fix ``error``."""
    return isinstance(error, ROUTING_ERRORS)


class _Lru(Generic[C]):
    """Address -> channel (and its stubs), evicting the least recently used. The owner locks changes.

    Use is recorded with one dict store from a counter (``touch``), no lock and no reordering: a cached
    stub is handed out on every RPC, and that must cost what a dict lookup costs. Finding the least
    recently used address is a scan of at most ``max_peers`` entries, only when a new address needs room.
    """

    def __init__(self, max_peers: int) -> None:
        if max_peers < 1:
            raise ValueError("max_peers must be >= 1")
        self.max_peers = max_peers
        self.channels: dict[str, C] = {}
        self.stubs: dict[tuple[str, type[Any]], Any] = {}
        self.last_use: dict[str, int] = {}
        self._clock = itertools.count(1)

    def touch(self, address: str) -> None:
        self.last_use[address] = next(self._clock)

    def get(self, address: str, make: Callable[[str], C]) -> tuple[C, list[C]]:
        """The channel to ``address`` (made if new) and the channels evicted to make room."""
        self.touch(address)
        channel = self.channels.get(address)
        if channel is not None:
            return channel, []
        evicted = []
        while len(self.channels) >= self.max_peers:
            oldest = min(self.channels, key=lambda a: self.last_use.get(a, 0))
            evicted.append(self.channels.pop(oldest))
            self._forget(oldest)
        channel = self.channels[address] = make(address)
        return channel, evicted

    def pop(self, address: str) -> C | None:
        self._forget(address)
        return self.channels.pop(address, None)

    def clear(self) -> list[C]:
        channels = list(self.channels.values())
        self.channels.clear()
        self.stubs.clear()
        self.last_use.clear()
        return channels

    def _forget(self, address: str) -> None:
        self.last_use.pop(address, None)
        for key in [k for k in self.stubs if k[0] == address]:
            del self.stubs[key]


def _sync_channel(address: str, security: ClientSecurity) -> grpc.Channel:
    """A blocking channel: TLS when ``security`` has it, the token interceptor only with a token."""
    tls = security.tls
    options = PEER_CHANNEL_OPTIONS + channel_options(tls)
    if tls is None:
        channel = grpc.insecure_channel(address, options=options)
    else:
        channel = grpc.secure_channel(address, channel_credentials(tls), options=options)
    if security.token is None:
        return channel
    return grpc.intercept_channel(channel, TokenInterceptor(security))


def _aio_channel(address: str, security: ClientSecurity) -> aio.Channel:
    tls = security.tls
    options = PEER_CHANNEL_OPTIONS + channel_options(tls)
    interceptors = aio_token_interceptors(security) if security.token is not None else None
    if tls is None:
        return aio.insecure_channel(address, options=options, interceptors=interceptors)
    return aio.secure_channel(address, channel_credentials(tls), options=options, interceptors=interceptors)


class Peers:
    """Channels for blocking callers (the SDK's threads). Thread-safe.

    Caller: the Client and everything it creates (admin, producers, fetchers, the Spark source, the CLI).
    ``security``: the Client's TLS and token (None: the process's, ``process_security()``).
    """

    def __init__(self, max_peers: int = MAX_PEERS, security: ClientSecurity | None = None) -> None:
        self.security = security if security is not None else process_security()
        self._lock = threading.Lock()
        self._cache: _Lru[grpc.Channel] = _Lru(max_peers)
        self._closed = False

    def stub(self, address: str, stub_class: type[S]) -> S:
        """The ``stub_class`` stub on the channel to ``address`` (one per address and kind)."""
        key = (address, stub_class)
        stub = self._cache.stubs.get(key)
        if stub is not None:  # the path of every RPC: no lock
            self._cache.touch(address)
            return stub  # type: ignore[no-any-return]
        with self._lock:
            stub = self._cache.stubs.get(key)  # another thread may have made it meanwhile
            evicted: list[grpc.Channel] = []
            if stub is None:
                channel, evicted = self._channel(address)
                made: Any = stub_class
                stub = self._cache.stubs[key] = made(channel)
        for old in evicted:
            old.close()
        return stub  # type: ignore[no-any-return]

    def _channel(self, address: str) -> tuple[grpc.Channel, list[grpc.Channel]]:
        if self._closed:
            raise SluiceError("the client is closed")
        return self._cache.get(address, lambda a: _sync_channel(a, self.security))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = self._cache.clear()
        for channel in channels:
            channel.close()


class AioPeers:
    """Channels for a service's event loop (``grpc.aio``). Use from that loop only.

    Caller: the dispatcher (brokers, coordinator, offset store), the coordinator (brokers: partition pushes,
    lag; the leader: forwarded Metadata), the broker (the coordinator) and the offset store (coordinator
    and brokers, for resets). ``security``: None in a service (the process's own, set at its start by
    ``set_process_security``); the SDK's group driver passes its Client's.
    """

    def __init__(
        self,
        max_peers: int = MAX_PEERS,
        retire_grace_s: float = 10.0,
        security: ClientSecurity | None = None,
    ) -> None:
        self.security = security if security is not None else process_security()
        self._cache: _Lru[aio.Channel] = _Lru(max_peers)
        #: Calls still running on an evicted or dropped channel get this long to finish.
        self._grace = retire_grace_s
        self._retiring: set[asyncio.Task[None]] = set()
        self._closed = False

    def _channel(self, address: str) -> aio.Channel:
        if self._closed:
            raise SluiceError("the peer channels are closed")
        channel, evicted = self._cache.get(address, lambda a: _aio_channel(a, self.security))
        for old in evicted:
            self._retire(old)
        return channel

    def broker(self, address: str) -> broker_pb2_grpc.BrokerAsyncStub:
        stub: broker_pb2_grpc.BrokerAsyncStub = self._stub(address, broker_pb2_grpc.BrokerStub)
        return stub

    def coordinator(self, address: str) -> coordinator_pb2_grpc.CoordinatorAsyncStub:
        stub: coordinator_pb2_grpc.CoordinatorAsyncStub = self._stub(
            address, coordinator_pb2_grpc.CoordinatorStub
        )
        return stub

    def acls(self, address: str) -> acl_pb2_grpc.AclsAsyncStub:
        """The coordinator's Acls service (security snapshots: ``sluice.security.watcher``)."""
        stub: acl_pb2_grpc.AclsAsyncStub = self._stub(address, acl_pb2_grpc.AclsStub)
        return stub

    def quotas(self, address: str) -> quota_pb2_grpc.QuotasAsyncStub:
        """The coordinator's Quotas service (quota snapshots: ``sluice.quotas.poller``)."""
        stub: quota_pb2_grpc.QuotasAsyncStub = self._stub(address, quota_pb2_grpc.QuotasStub)
        return stub

    def offset_store(self, address: str) -> offset_store_pb2_grpc.OffsetStoreAsyncStub:
        stub: offset_store_pb2_grpc.OffsetStoreAsyncStub = self._stub(
            address, offset_store_pb2_grpc.OffsetStoreStub
        )
        return stub

    def _stub(self, address: str, stub_class: type[Any]) -> Any:
        """The ``stub_class`` stub on the channel to ``address`` (one per address and kind): a stub is
        a dozen method objects, built once instead of on every call."""
        key = (address, stub_class)
        stub = self._cache.stubs.get(key)
        if stub is None:
            stub = self._cache.stubs[key] = stub_class(self._channel(address))
        else:
            self._cache.touch(address)
        return stub

    def drop(self, address: str) -> None:
        """Close the channel to ``address`` (the peer moved away); calls on it get the grace to finish."""
        channel = self._cache.pop(address)
        if channel is not None:
            self._retire(channel)

    def _retire(self, channel: aio.Channel) -> None:
        task = asyncio.get_running_loop().create_task(channel.close(self._grace))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def close(self) -> None:
        """Close every channel now (running calls are cancelled); idempotent."""
        self._closed = True
        for channel in self._cache.clear():
            await channel.close(None)
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)


class RefreshGate:
    """Runs ``refresh`` once per burst of routing errors, for blocking callers. Thread-safe.

    A caller reads :attr:`generation` before it sends (the metadata its request was planned with), and
    after a routing error calls :meth:`refresh_after` with it: when a refresh finished since, the metadata
    is already newer than the request and nothing is asked; callers arriving while a refresh runs wait for
    it instead of starting another.
    """

    def __init__(self, refresh: Callable[[], object]) -> None:
        self._refresh = refresh
        self._lock = threading.Lock()
        self.generation = 0

    def refresh_after(self, seen: int) -> None:
        if self.generation > seen:
            return
        with self._lock:  # one refresh at a time; who waited here finds it done
            if self.generation > seen:
                return
            self._refresh()
            self.generation += 1


class AioRefreshGate:
    """:class:`RefreshGate` for one event loop: ``refresh`` is a coroutine function."""

    def __init__(self, refresh: Callable[[], Awaitable[object]]) -> None:
        self._refresh = refresh
        self._lock = asyncio.Lock()
        self.generation = 0

    async def refresh_after(self, seen: int) -> None:
        if self.generation > seen:
            return
        async with self._lock:
            if self.generation > seen:
                return
            await self._refresh()
            self.generation += 1
