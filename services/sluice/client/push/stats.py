"""What ``PushConsumer.stats()`` returns: a snapshot of the consumer's counters."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.client.push.flow import FlowStats

__all__ = ["PushConsumerStats", "StreamInfo"]


@dataclass(frozen=True, slots=True)
class StreamInfo:
    dispatcher_id: str
    address: str | None
    partitions: tuple[int, ...]
    state: str
    sessions: int
    reconnects: int
    last_error: str | None
    #: The consumer's topic, or its redrive topic.
    topic: str = ""


@dataclass(frozen=True, slots=True)
class PushConsumerStats:
    """Counters of one consumer (``pc.stats()``): flow, acks and streams."""

    flow: FlowStats
    #: Messages taken by the application and not yet acked or nacked (current sessions).
    unacked: int
    acked: int
    nacked: int
    #: Acks/nacks dropped because the message's stream session had ended (it is redelivered).
    stale_acks: int
    #: Errors the dispatcher reported for single commands (unknown message ids, ...).
    command_errors: int
    #: Zero-queue: times the one permit was moved off an idle dispatcher.
    handoffs: int
    #: Times the coordinator's routing changed and every stream was replaced (their
    #: ``reconnects`` start again from 0).
    reroutes: int
    streams: tuple[StreamInfo, ...]
    active_partitions: frozenset[int]
    #: ``Ack`` commands written to the dispatchers so far: individual acks are grouped
    #: (``ack_group_time``), so this grows far slower than ``acked``.
    ack_commands: int = 0
