"""The typed errors of delayed delivery, retry and dead letters (issue 17). Re-exported by ``sluice.errors``.

A module of its own because ``sluice.errors`` is at the module size limit; it depends only on the root
class, so importing it from ``sluice.errors`` makes no cycle.
"""

from __future__ import annotations

from sluice.error_base import SluiceError
from sluice.v1 import common_pb2

# ---- Delayed delivery (docs/delayed-delivery.md) -------------------------------------


class DelayTooLong(SluiceError, ValueError):
    """A delayed send beyond the maximum delay (docs/delayed-delivery.md); the message names it."""

    code = common_pb2.DELAY_TOO_LONG
    grpc_status = "INVALID_ARGUMENT"


class DelayBeyondRetention(SluiceError, ValueError):
    """A delay longer than the target's (or the schedule topic's) retention; the message names it."""

    code = common_pb2.DELAY_BEYOND_RETENTION
    grpc_status = "INVALID_ARGUMENT"


class DelayedDeliveryUnavailable(SluiceError):
    """No schedule topic ``__sluice_schedule``: start ``sluice scheduler``, which creates it."""

    code = common_pb2.DELAYED_DELIVERY_UNAVAILABLE
    grpc_status = "FAILED_PRECONDITION"


# ---- Retry and dead letters of pull groups (docs/retry.md) ------------------------


class ReconsumeRefused(SluiceError):
    """``reconsume_later()`` on a consumer made with ``orderly=True``: a retry breaks the partition's
    order, so an ordered consumer retries in place (RocketMQ's orderly consumers do the same)."""

    code = common_pb2.RECONSUME_REFUSED
    grpc_status = "FAILED_PRECONDITION"


class RecordNotOwned(SluiceError):
    """The record's partition is not assigned to this consumer, or poll() did not hand the record out."""

    code = common_pb2.RECORD_NOT_OWNED
    grpc_status = "FAILED_PRECONDITION"


class DelayLevelOutOfRange(SluiceError, ValueError):
    """A delay level outside 1..N; the message names the range and the group's levels."""

    code = common_pb2.DELAY_LEVEL_OUT_OF_RANGE
    grpc_status = "INVALID_ARGUMENT"


class NotADlqTopic(SluiceError, ValueError):
    """A DLQ operation named a topic that is not a dead-letter topic (``DLQ.<group>``)."""

    code = common_pb2.NOT_A_DLQ_TOPIC
    grpc_status = "INVALID_ARGUMENT"


# ---- Key_Shared parking (docs/poison-keys.md) -------------------------------------------


class ParkStoreLoading(SluiceError):
    """The subscription's parking store is still loading on the dispatcher (a restart, its first
    consumer back): its parked keys are not known yet, so neither a listing nor an unpark is answered
    from a partial state. Ask again shortly."""

    code = common_pb2.PARK_STORE_LOADING
    retriable = True
    grpc_status = "UNAVAILABLE"
