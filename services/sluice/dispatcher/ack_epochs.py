"""Acks and nacks that name the leader epoch of the record they settle (KIP-320 for push consumers;
docs/dispatcher.md, "Acks across a truncation"). Pure: no I/O, like the state machine it guards.

After an unclean election truncates records the dispatcher had sent (``truncation.py``), the new
leader's records take their offsets and are delivered, possibly to the same consumer. A late ack of the
old record at offset X must not settle the new record at X, which the consumer may never have seen: that
would be a silent loss. So a client names, with each ack or nack, the leader epoch of the record's batch
(``MessageId.leader_epoch``, ``OffsetRanges.leader_epoch``), and the dispatcher compares it with the
epoch of the message it holds at that offset. A different epoch means the record acked is gone: that
offset is refused (not applied, counted in ``sluice_dispatcher_epoch_refused_acks_total``, reported to
the consumer as an unknown id), and the new record stays where it is, in flight or waiting, until it is
acknowledged under its own epoch or redelivered. An ack without an epoch (an older client) is not checked.

Caller: ``DispatcherService.ack``/``nack``, before the state machine applies what is left.

*Cost:* one claim per ack group (the SDK sends one ``OffsetRanges`` per partition and epoch), and for
the usual group two dict lookups: the messages at its lowest and highest offset. Every message a
subscription holds is of the current log (a truncation drops every message at or above its point), and
epochs never decrease along a log, so when both ends carry the claimed epoch every held message between
does. Otherwise (a truncation under the group, or an end no longer held) each offset is checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

from sluice.dispatcher.consumer import Consumer
from sluice.dispatcher.messages import Message
from sluice.dispatcher.partition_state import PartitionState
from sluice.dispatcher.subscription import Subscription
from sluice.errors import UnknownMessageId

__all__ = ["Claim", "epoch_of", "refuse_stale", "unknown_ids"]

#: ``(partition, leader epoch, flat [start, end) bounds)``: offsets an ack or nack says are of that epoch.
Claim = tuple[int, int, list[int]]


def epoch_of(m: Message) -> int:
    """The leader epoch of the batch ``m`` was read from (-1: a batch stamped before epochs)."""
    return m.view.header.partition_leader_epoch


def _held(ps: PartitionState, cinf: dict[int, Message] | None, o: int) -> Message | None:
    """The message an ack of ``o`` would settle: in flight at the consumer, or back for redelivery."""
    m = cinf.get(o) if cinf is not None else None
    if m is None:
        m = ps.replay.get(o) or ps.delayed.get(o)
    return m


def _stale(sub: Subscription, consumer: Consumer, claims: Sequence[Claim]) -> dict[int, set[int]]:
    """Per partition, the claimed offsets whose held message is of another epoch."""
    out: dict[int, set[int]] = {}
    for p, epoch, bounds in claims:
        ps = sub.partitions.get(p)
        if ps is None or len(bounds) < 2:
            continue
        cinf = consumer.inflight.get(p)
        lo, hi = _held(ps, cinf, min(bounds)), _held(ps, cinf, max(bounds) - 1)
        if lo is not None and hi is not None and epoch_of(lo) == epoch == epoch_of(hi):
            continue  # the usual group (module docstring)
        for s, e in zip(bounds[::2], bounds[1::2], strict=False):
            for o in range(s, e):
                m = _held(ps, cinf, o)
                if m is not None and epoch_of(m) != epoch:
                    out.setdefault(p, set()).add(o)
    return out


def _stale_cumulative(sub: Subscription, consumer: Consumer, claims: Sequence[Claim]) -> set[int]:
    """Partitions whose cumulative ack names a record that is gone: the message held at its offset is of
    another epoch, or (none held there) a message held below it is of a newer epoch, which only a
    truncation puts below a record of the claimed one."""
    out: set[int] = set()
    for p, epoch, bounds in claims:
        ps = sub.partitions.get(p)
        if ps is None or not bounds:
            continue
        top = max(bounds) - 1
        cinf = consumer.inflight.get(p)
        m = _held(ps, cinf, top)
        if m is not None:
            if epoch_of(m) != epoch:
                out.add(p)
            continue
        below = [o for o in chain(cinf or (), ps.replay, ps.delayed) if o < top]
        if below:
            highest = _held(ps, cinf, max(below))
            if highest is not None and epoch_of(highest) > epoch:
                out.add(p)
    return out


def refuse_stale(
    sub: Subscription,
    consumer: Consumer,
    by_partition: dict[int, list[int]],
    claims: Sequence[Claim],
    cumulative: bool = False,
) -> list[tuple[int, int]]:
    """Take out of ``by_partition`` (in place) the offsets whose record the claims show is gone; returns
    them as ``(partition, offset)``. A refused cumulative ack is refused whole (its partition goes)."""
    if not claims:
        return []
    refused: list[tuple[int, int]] = []
    if cumulative:
        for p in sorted(_stale_cumulative(sub, consumer, claims)):
            given = by_partition.pop(p, None)
            if given:
                refused.append((p, max(given)))
        return refused
    for p, offsets in sorted(_stale(sub, consumer, claims).items()):
        given = by_partition.get(p)
        if given is not None:
            kept = [o for o in given if o not in offsets]
            if kept:
                by_partition[p] = kept
            else:
                del by_partition[p]
        refused += [(p, o) for o in sorted(offsets)]
    return refused


def unknown_ids(bad: list[tuple[int, int]], refused: list[tuple[int, int]], what: str) -> UnknownMessageId:
    """The error for ids an ack or nack could not settle: ``bad`` (not this consumer's to settle) and
    ``refused`` (their record was truncated away: another epoch's record is at that offset now)."""
    parts = []
    for ids, why in (
        (bad, "not delivered to this consumer (unknown, not sent yet, or another consumer's)"),
        (refused, "of a leader epoch whose record at that offset was truncated (unclean election)"),
    ):
        if ids:
            shown = ", ".join(f"{p}/{o}" for p, o in ids[:20])
            more = f" and {len(ids) - 20} more" if len(ids) > 20 else ""
            parts.append(f"{len(ids)} message id(s) {why}: {shown}{more}")
    return UnknownMessageId(f"cannot {what} {'; '.join(parts)}; the others were applied")
