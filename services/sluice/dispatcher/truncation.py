"""A subscription's partition after its log was truncated under it (KIP-320; docs/dispatcher.md, "Across
a leader change"). Pure: no I/O, like the state machine it edits.

An unclean election can make a new leader whose log ends below records the dispatcher already read: they
are gone, and the new leader's records take their offsets. Caller: ``SubscriptionRuntime.truncated``, when
the partition's feed found the truncation point ``end`` (``epoch_check.FeedEpochs``). Then:

- **Acknowledged offsets at or above ``end`` are no longer acknowledged** (``PartitionCursor.truncate``):
  they will hold new records, which nobody has seen.
- **Messages read at or above ``end`` are dropped in every state**: read and not sent (``pending``), sent
  and unacknowledged (``inflight``, also at their consumer, whose unacked count goes down), back for
  redelivery (``replay``, ``delayed``), waiting for the DLQ (``dead``) or parked behind a Key_Shared key.
  They hold records of the old log: sending them again would deliver records from a log that no longer
  exists. A consumer acknowledging one of them later is told the id is unknown (``UNKNOWN_MESSAGE_ID``,
  as for any id that is not in flight), so the new record at that offset is not acknowledged by it.
- **The read position goes back to ``end``**, so the feed reads the new leader's records from there.
"""

from __future__ import annotations

from collections import Counter

from sluice.dispatcher.consumer import Consumer
from sluice.dispatcher.messages import Message
from sluice.dispatcher.subscription import Subscription

__all__ = ["truncate_partition"]


def truncate_partition(sub: Subscription, partition: int, end: int) -> tuple[int, int]:
    """Forget everything of ``partition`` at or above ``end``; returns (messages dropped, acknowledged
    offsets forgotten). The caller dispatches afterwards (permits may have been freed)."""
    ps = sub.partitions.get(partition)
    if ps is None:
        return 0, 0
    dropped: list[Message] = []
    ps.unfile()  # Key_Shared: the filed prefix back in order (and the gate may go down)
    pending = ps.pending
    while pending and pending[-1].offset >= end:  # offset order
        m = pending.pop()
        ps.pending_bytes -= m.size
        dropped.append(m)
    for held in (ps.replay, ps.delayed, ps.dead):
        for o in [o for o in held if o >= end]:
            dropped.append(held.pop(o))
    if ps.awaiting_save:
        ps.awaiting_save = {o for o in ps.awaiting_save if o < end}
    released: Counter[Consumer] = Counter()
    for o in [o for o in ps.inflight if o >= end]:
        c = ps.inflight.pop(o)
        ps.delivery_seq.pop(o, None)
        m = c.inflight[partition].pop(o)
        sub._release_hash(c, m)  # Key_Shared: the key is no longer held by this message
        released[c] += 1
        dropped.append(m)
    for c, n in released.items():
        c.on_released(n)
    dropped += _unpark(sub, partition, end)
    ps.credit_messages(dropped)
    forgotten = ps.cursor.truncate(end)
    ps.read_position = min(ps.read_position, end)
    return len(dropped), forgotten


def _unpark(sub: Subscription, partition: int, end: int) -> list[Message]:
    """Parked messages of the truncated records go (as ``Parking.drop_partition`` does for a partition
    no longer served); a key whose failing head was one of them is released."""
    parking = sub.parking
    out: list[Message] = []
    for key, pk in list(parking.keys.items()):
        kept = [m for m in pk.waiting if m.partition != partition or m.offset < end]
        if len(kept) != len(pk.waiting):
            out += [m for m in pk.waiting if m.partition == partition and m.offset >= end]
            parking.waiting_total -= len(pk.waiting) - len(kept)
            pk.waiting = kept
        if pk.head is not None and pk.head[0] == partition and pk.head[1] >= end:
            parking.release(sub, key, fresh=False)
    return out
