"""Key_Shared parking after a restart: the parking store's replay, and messages read again past their limit.

Pure, like ``parking.py``. ``restore`` rebuilds the parked keys of a subscription being loaded from the
replayed store (``retry.parkbook.ParkBook``, shared with the pull side) before its feeds read anything:

- every offset the store ever parked is acknowledged on the cursor, whatever the persisted cursor says:
  a ``kill -9`` between the park write and the cursor's acknowledgement (or its flush) left it
  unacknowledged there, and read again from the log it would be parked, or delivered, twice;
- the keys still parked come back with their messages in (partition, offset) order, the head's
  failure count, and the policy's state: past ``max_redeliver`` under the hold policy the key is held
  at once; otherwise its oldest parked message is the head, retried now, ahead of everything later of
  the key (which the feed reads behind it and parks).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol

from sluice.codec.batch import BatchBuilder, Record, batch_views, stamp
from sluice.dispatcher.budget import HELD_OVERHEAD
from sluice.dispatcher.keyshared import key_hash
from sluice.dispatcher.messages import Message, messages_of
from sluice.dispatcher.parking import Parkable, ParkedKey, Parking, ParkState
from sluice.dispatcher.partition_state import PartitionState
from sluice.retry.parkbook import ParkBook

__all__ = ["Restorable", "message_of", "past_limit", "restore"]


class Restorable(Parkable, Protocol):
    """A subscription with its parking (``Subscription`` is one)."""

    parking: Parking


def message_of(record: Record, partition: int, offset: int) -> Message:
    """A parked record, replayed from the store, as the message it was: its own one-record log batch
    at its original offset (what a consumer receives is the same as from the log)."""
    builder = BatchBuilder()
    builder.append(record.value, record.key, record.tag, record.headers or None, record.timestamp)
    raw = bytearray(builder.build())
    stamp(raw, 0, offset, record.timestamp, 0)
    return messages_of(batch_views(bytes(raw)), partition, offset)[0]


def restore(sub: Restorable, book: ParkBook, topic: str, limit: int, now_ms: int, wall_ms: int) -> int:
    """Rebuild ``sub``'s parked keys from ``book`` (replayed), for the partitions it serves; returns
    the number of keys parked. ``now_ms`` is parking's clock, ``wall_ms`` the book's."""
    for p, ps in sub.partitions.items():
        offsets = book.offsets_parked((topic, p), ps.cursor.mark_delete)
        if offsets:
            ps.cursor.ack_sorted(offsets)
    by_key: dict[bytes, list[tuple[int, Record, int, int]]] = defaultdict(list)
    for ((t, p), key), bk in book.keys.items():
        if t == topic and p in sub.partitions:
            by_key[key] += [(p, r, bk.count, bk.since_ms) for r in bk.pending]
    parking = sub.parking
    for key, entries in by_key.items():
        msgs = sorted(
            (message_of(r, p, r.offset) for p, r, _, _ in entries), key=lambda m: (m.partition, m.offset)
        )
        count = max(c for _, _, c, _ in entries)
        since = min(s for _, _, _, s in entries)
        pk = ParkedKey(key, key_hash(key), now_ms - max(wall_ms - since, 0), None)
        parking.keys[key] = pk
        parking.hashes[pk.key_hash] = parking.hashes.get(pk.key_hash, 0) + 1
        for m in msgs:
            ps = sub.partitions[m.partition]
            ps.charge(m.size + HELD_OVERHEAD)
            parking.adopt(pk, m)
        head = msgs[0]
        pk.head = (head.partition, head.offset)
        if count:
            parking.counts[pk.head] = count
        if limit and count > limit:
            pk.state = ParkState.HELD if sub.settings.park_hold else ParkState.DLQ
            continue
        # The oldest is the head, tried now; the rest waits behind it.
        pk.waiting.pop(0)
        parking.waiting_total -= 1
        pk.nbytes -= head.size
        parking.bytes_total -= head.size
        sub.partitions[head.partition].add_replay(head)
    return len(by_key)


def past_limit(
    sub: Restorable, ps: PartitionState, msgs: list[Message], counts: list[int], limit: int, now_ms: int
) -> tuple[list[Message], list[int]]:
    """Messages read again after a restart, some with a count already past ``limit``: those go straight
    to the DLQ, or under the hold policy are held (and what follows of their key in this batch).
    Returns the rest, to deliver, with their counts."""
    keep: list[Message] = []
    kept_counts: list[int] = []
    parking = sub.parking
    hold = parking.on and sub.settings.park_hold
    for m, n in zip(msgs, counts, strict=True):
        if hold and (n > limit or parking.holds(m)):
            parking.hold(sub, m, now_ms, n)
        elif n > limit:
            ps.dead[m.offset] = m
            sub.fx.dead_letters.append((m, n))
        else:
            keep.append(m)
            kept_counts.append(n)
    return keep, kept_counts
