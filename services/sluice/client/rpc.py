"""The SDK's channels: one shared channel per address, typed errors on every call.

Error mapping itself lives in ``sluice.common.rpc`` (services use it too).
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar

import grpc

from sluice.common.rpc import (
    CHANNEL_OPTIONS,
    ERROR_CODE_KEY,
    MAX_MESSAGE_BYTES,
    call,
    error_from_rpc,
    is_unimplemented,
)
from sluice.errors import SluiceError

__all__ = [
    "CHANNEL_OPTIONS",
    "CLIENT_CHANNEL_OPTIONS",
    "ERROR_CODE_KEY",
    "MAX_MESSAGE_BYTES",
    "ChannelPool",
    "call",
    "error_from_rpc",
    "is_unimplemented",
]

S = TypeVar("S")


# ---- Channels ---------------------------------------------------------------------

# Client channels also reconnect quickly: a restarted broker or coordinator on the same
# address is usable again within a fraction of a second instead of gRPC's default 1-120 s.
CLIENT_CHANNEL_OPTIONS = (
    *CHANNEL_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


class ChannelPool:
    """One shared gRPC channel (and stub of each kind) per address.

    Caller: the Client and everything it creates (admin, producers, fetchers).
    Thread-safe; ``close()`` closes every channel.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[tuple[str, type[Any]], Any] = {}
        self._closed = False

    def channel(self, address: str) -> grpc.Channel:
        with self._lock:
            if self._closed:
                raise SluiceError("the client is closed")
            ch = self._channels.get(address)
            if ch is None:
                ch = self._channels[address] = grpc.insecure_channel(address, options=CLIENT_CHANNEL_OPTIONS)
            return ch

    def stub(self, address: str, stub_class: type[S]) -> S:
        key = (address, stub_class)
        stub = self._stubs.get(key)
        if stub is None:
            made: Any = stub_class
            stub = made(self.channel(address))
            with self._lock:
                stub = self._stubs.setdefault(key, stub)
        return stub  # type: ignore[no-any-return]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
        for ch in channels:
            ch.close()
