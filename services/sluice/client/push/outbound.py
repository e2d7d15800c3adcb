"""The client-to-dispatcher half of one Consume stream session.

Application threads hand commands to :class:`Outbound` (a lock and a few lists, no
I/O); gRPC's request thread iterates it and gets protobuf commands. Whatever piled
up while the previous command was being written goes out coalesced: every pending
ack in one ``Ack``, every nack in one ``Nack``, the permits summed into one
``Flow``. Acks alone are grouped (Pulsar's ack grouping tracker): they wait up to the
consumer's ``ack_group_time`` (default ``ACK_GROUP_TIME``, 2 ms) or until ``ACK_BATCH``
are pending: waking the writer for every ack made one ``Ack`` command per message or two
under load, which cost both sides far more than the acks themselves. Anything else
pending (permits, nacks, a close) sends the acks with it at once. An ack still grouped
when the process dies is lost with it and its message redelivered (at-least-once, as
before: docs/push-consumer.md, "Acks"). When the dispatcher
takes acks as ranges (``Subscribed.record_batches``) an ``Ack`` carries ``[start, end)``
runs per partition instead of one id per message: consecutive offsets, the usual case,
cost one pair of numbers.

Every ack and nack names the leader epoch of its record's batch (``AckKey``), so the dispatcher
refuses one whose record an unclean election truncated away instead of acknowledging the record now
at its offset (docs/dispatcher.md, "Acks across a truncation"). Ranges go one ``OffsetRanges`` per
partition and epoch: a group of acks all of one epoch (every group but those spanning a leader
change) is found at C level, with no step per ack.

Acks go before permits in each round, so a consumer blocked on ``max_unacked`` is
unblocked before it asks for more.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat, starmap
from operator import itemgetter
from typing import Any

from sluice.v1 import dispatcher_pb2 as pb

__all__ = ["ACK_BATCH", "ACK_GROUP_TIME", "AckKey", "Outbound", "ack_ranges"]

#: ``(partition, offset, leader epoch)`` of a message to ack or nack (epoch None: not known, sent without).
AckKey = tuple[int, int, int | None]

_partition_of = itemgetter(0)
_offset_of = itemgetter(1)
_epoch_of = itemgetter(2)

# Bound one Ack message (and the time the writer holds the batch) under a flood of acks.
MAX_IDS_PER_COMMAND = 10_000
#: Default ``ack_group_time``: acks wait at most this long for company before they are written
#: (Pulsar's ``acknowledgementGroupTime``, 100 ms by default). 2 ms turns a stream of acks into a
#: few commands; 10 ms measured a higher delivery p50 at 2,000 records/s in 5 of 6 noisy pairs, so
#: the default stays where it was (docs/push-consumer.md, "Acks").
ACK_GROUP_TIME = 0.002
#: ... or until this many are pending (Pulsar's ``maxAcknowledgmentGroupSize``).
ACK_BATCH = 1000


class Outbound:
    """Pending commands of one stream session. Thread-safe."""

    def __init__(self, subscribe: pb.Subscribe, ack_group_time: float = ACK_GROUP_TIME) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._subscribe = subscribe
        #: Seconds acks alone wait for company (0: written as soon as the writer is free).
        self._group_time = ack_group_time
        # Individual acks, the hot path, skip the lock: deque.append and popleft are
        # atomic. The writer sets _writer_waiting under the lock *before* it looks at
        # the deque a last time, and an ack reads the flag *after* appending, so an ack
        # either is seen by that look or sees the flag and wakes the writer.
        self._acks: deque[AckKey] = deque()
        #: partition -> (offset, leader epoch) of the highest cumulative ack.
        self._cumulative: dict[int, tuple[int, int | None]] = {}
        self._nacks: list[AckKey] = []
        self._permits = 0
        self._closed = False
        self._finishing = False
        self._writer_waiting = False
        #: The writer waits (with a timeout) for more acks to join those pending.
        self._lingering = False
        #: The waiting writer was notified already (more notifies would only contend the lock).
        self._woken = False
        #: Send individual acks as ``Ack.ranges`` (set by the stream once the dispatcher said it
        #: takes them); else as ``Ack.ids``.
        self.ack_ranges = False
        #: Commands written so far, by kind (for tests and stats).
        self.sent = {"flow": 0, "ack": 0, "nack": 0, "permits": 0}
        #: ``flow()`` calls so far, and how many of them the writer has written (``wait_flow_written``).
        #: Their own condition: the writer's is notified for one waiter, the writer.
        self._flow_seq = 0
        self._flows_written = 0
        self._written = threading.Condition(threading.Lock())

    # ---- producers (any thread) ---------------------------------------------------------

    def flow(self, permits: int) -> int:
        """Grant ``permits``; returns the grant's number for ``wait_flow_written``."""
        with self._cond:
            self._permits += permits
            self._flow_seq += 1
            self._wake()
            return self._flow_seq

    def wait_flow_written(self, seq: int, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until the writer has written grant ``seq``. Caller: the
        application's thread right after a batch receive granted permits: it computes on the batch
        next, and the writer thread would otherwise wait for the GIL (up to the 5 ms switch interval)
        with the grant unsent, so the dispatcher would not send the next messages meanwhile."""
        with self._written:
            self._written.wait_for(lambda: self._flows_written >= seq or self._closed, timeout)

    def ack(self, partition: int, offset: int, leader_epoch: int | None = None) -> None:
        self.ack_id((partition, offset, leader_epoch))

    def ack_id(self, key: AckKey) -> None:
        """``ack`` of a ``(partition, offset, leader epoch)`` id as it is (no tuple built again).
        Caller: ``PushConsumer.ack``, once per message."""
        acks = self._acks
        acks.append(key)
        # Wake a writer waiting for work (it then lingers for more acks), or end its linger at
        # ACK_BATCH; acks during the linger need no wake-up. Read after the append (see __init__).
        # One wake-up per writer wait: notifying on every ack past the threshold made the
        # acking thread fight the waking writer for the lock (a convoy costing microseconds per ack).
        if self._writer_waiting and not self._woken and (not self._lingering or len(acks) >= ACK_BATCH):
            with self._cond:
                self._wake()

    def ack_many(self, ids: Iterable[AckKey]) -> None:
        """``ack`` for many ``(partition, offset, leader epoch)`` ids: one extend, at most one wake-up."""
        acks = self._acks
        acks.extend(ids)
        if self._writer_waiting and not self._woken and (not self._lingering or len(acks) >= ACK_BATCH):
            with self._cond:
                self._wake()

    def ack_cumulative(self, partition: int, offset: int, leader_epoch: int | None = None) -> None:
        with self._cond:
            if offset > self._cumulative.get(partition, (-1, None))[0]:
                self._cumulative[partition] = (offset, leader_epoch)
            self._wake()

    def nack(self, partition: int, offset: int, leader_epoch: int | None = None) -> None:
        with self._cond:
            self._nacks.append((partition, offset, leader_epoch))
            self._wake()

    def close(self) -> None:
        """End the request stream (the session is over); pending commands are dropped."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def finish(self) -> None:
        """End the request stream once everything pending is written (a graceful close)."""
        with self._cond:
            self._finishing = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def _wake(self) -> None:
        """Under the lock."""
        if self._writer_waiting and not self._woken:
            self._woken = True
            self._cond.notify()

    # ---- the writer (gRPC's request thread) ----------------------------------------------

    def __iter__(self) -> Iterator[pb.ConsumerCommand]:
        yield pb.ConsumerCommand(subscribe=self._subscribe)
        while True:
            with self._cond:
                linger_until = 0.0
                while True:
                    self._writer_waiting = True
                    self._woken = False
                    if self._closed or self._cumulative or self._nacks or self._permits:
                        break
                    if self._acks:
                        if self._finishing or len(self._acks) >= ACK_BATCH or self._group_time <= 0:
                            break
                        now = time.monotonic()
                        if not linger_until:
                            linger_until = now + self._group_time
                        elif now >= linger_until:
                            break
                        self._lingering = True
                        self._cond.wait(linger_until - now)
                        continue
                    if self._finishing:
                        return
                    self._lingering = False
                    self._cond.wait()
                self._writer_waiting = self._lingering = False
                if self._closed:
                    return
                # starmap: the pops at C level (a comprehension was a Python step per ack).
                n = min(len(self._acks), MAX_IDS_PER_COMMAND)
                acks = list(starmap(self._acks.popleft, repeat((), n)))
                cumulative, self._cumulative = self._cumulative, {}
                nacks, self._nacks = self._nacks, []
                permits, self._permits = self._permits, 0
                flow_seq = self._flow_seq
            yield from self._commands(acks, cumulative, nacks, permits)
            if permits:  # asked for again: the grant was handed on (written, on the wire)
                with self._written:
                    self._flows_written = flow_seq
                    self._written.notify_all()

    def _commands(
        self,
        acks: list[AckKey],
        cumulative: dict[int, tuple[int, int | None]],
        nacks: list[AckKey],
        permits: int,
    ) -> Iterator[pb.ConsumerCommand]:
        # Built in place inside the command: ConsumerCommand(ack=...) would copy every id.
        if acks:
            cmd = pb.ConsumerCommand()
            if self.ack_ranges:
                add_ranges = cmd.ack.ranges.add
                for epoch, group in by_epoch(acks):
                    for p, bounds in ack_ranges(group).items():
                        r = add_ranges(partition=p, bounds=bounds)
                        if epoch is not None:
                            r.leader_epoch = epoch
            else:
                _add_ids(cmd.ack.ids, acks)
            self.sent["ack"] += 1
            yield cmd
        if cumulative:
            cmd = pb.ConsumerCommand()
            cmd.ack.cumulative = True
            _add_ids(cmd.ack.ids, [(p, o, e) for p, (o, e) in sorted(cumulative.items())])
            self.sent["ack"] += 1
            yield cmd
        if nacks:
            cmd = pb.ConsumerCommand()
            _add_ids(cmd.nack.ids, nacks)
            self.sent["nack"] += 1
            yield cmd
        if permits:
            # The wire field is int32; a (huge) sum is split rather than overflowing.
            while permits > 0:
                n = min(permits, 2**31 - 1)
                permits -= n
                self.sent["flow"] += 1
                self.sent["permits"] += n
                yield pb.ConsumerCommand(flow=pb.Flow(permits=n))


def _add_ids(ids: Any, keys: Iterable[AckKey]) -> None:
    """``MessageId``s of ``keys`` added to the repeated field ``ids``, with their epoch when known."""
    add = ids.add
    for p, o, e in keys:
        if e is None:
            add(partition=p, offset=o)
        else:
            add(partition=p, offset=o, leader_epoch=e)


def by_epoch(acks: list[AckKey]) -> list[tuple[int | None, list[AckKey]]]:
    """``acks`` grouped by leader epoch: the usual group, all of one epoch, as it is (a C-level set)."""
    epochs = set(map(_epoch_of, acks))
    if len(epochs) == 1:
        return [(epochs.pop(), acks)]
    groups: dict[int | None, list[AckKey]] = {e: [] for e in epochs}
    for a in acks:
        groups[a[2]].append(a)
    return list(groups.items())


def ack_ranges(acks: Sequence[AckKey | tuple[int, int]]) -> dict[int, list[int]]:
    """``(partition, offset, ...)`` ids -> per partition the flat ``[start, end)`` bounds of their runs.

    >>> ack_ranges([(0, 5), (0, 3), (1, 9), (0, 4), (0, 7)])
    {0: [3, 6, 7, 8], 1: [9, 10]}
    """
    if acks:
        partitions = set(map(_partition_of, acks))
        if len(partitions) == 1:
            # One partition (the usual group): C-level set and sort, and one run when they are
            # consecutive, with no step per ack.
            distinct = sorted(set(map(_offset_of, acks)))
            if distinct[-1] - distinct[0] + 1 == len(distinct):
                return {partitions.pop(): [distinct[0], distinct[-1] + 1]}
    by: dict[int, list[int]] = {}
    for p, o, *_ in acks:
        offsets = by.get(p)
        if offsets is None:
            by[p] = [o]
        else:
            offsets.append(o)
    out: dict[int, list[int]] = {}
    for p, offsets in by.items():
        offsets.sort()
        bounds = [offsets[0]]
        end = offsets[0] + 1
        for o in offsets:
            if o > end:
                bounds += (end, o)
            end = o + 1 if o >= end else end
        bounds.append(end)
        out[p] = bounds
    return out
