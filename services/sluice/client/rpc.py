"""The SDK's gRPC helpers: typed errors on every call.

Error mapping itself lives in ``sluice.common.rpc`` (services use it too); the SDK's channels are the
peer layer's (``sluice.common.peers.Peers``).
"""

from __future__ import annotations

from sluice.common.rpc import (
    CHANNEL_OPTIONS,
    ERROR_CODE_KEY,
    MAX_MESSAGE_BYTES,
    call,
    error_from_rpc,
    is_unimplemented,
)

__all__ = [
    "CHANNEL_OPTIONS",
    "ERROR_CODE_KEY",
    "MAX_MESSAGE_BYTES",
    "call",
    "error_from_rpc",
    "is_unimplemented",
]
