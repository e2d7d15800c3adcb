"""The record accumulator: per-partition batches waiting to be sent.

A pure state machine (no I/O, no threads; the clock is injected) so batching by
size and linger, retry ordering and expiry are unit-tested with a fake clock.
It is not thread-safe: the producer calls every method with its lock held.

Per partition there is at most one *open* batch (still taking records), a queue of
*closed* batches waiting to be sent, and the batches in flight. How many may fly at once is
``max_in_flight_batches``:

- ``1`` (without idempotence): one *run* of batches (sent together in one request, appended in
  order) at a time. Nothing but one run in flight is what keeps a retry from reordering.
- ``2..5`` (with idempotence, Kafka's rule): up to that many batches in flight in several runs, pipelined on
  the partition's broker. Only *full* batches are pipelined: a partial (open) batch of a partition with
  batches in flight waits for their answers, whatever its linger (Nagle's rule). The broker's sequence check
  keeps their order. After a retriable failure the partition is *blocked*: nothing more goes out until every
  batch in flight has come back (later ones fail OUT_OF_ORDER_SEQUENCE, or succeed), and the failed ones are
  resent in creation order, each retried batch alone in its run (the broker then answers each as a whole
  duplicate or a whole new batch). Never more than 5 batches unacknowledged and stamped, so every retry is
  among the broker's last five batches of the producer and is recognised.

Batch lifecycle::

    OPEN --(full / linger / flush / drain)--> QUEUED --(drain)--> IN_FLIGHT
    IN_FLIGHT --(retriable error)--> QUEUED (back in creation order, after a backoff)
    IN_FLIGHT --(answer / fatal error)--> DONE
    OPEN / QUEUED --(delivery timeout / abort)--> DONE
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from enum import Enum

from sluice.client.producer.futures import BatchResult
from sluice.client.producer.partitioner import Partitioner
from sluice.codec.batch import BatchBuilder

__all__ = ["Accumulator", "BatchState", "ProducerBatch"]


class BatchState(Enum):
    OPEN = "open"
    QUEUED = "queued"
    IN_FLIGHT = "in_flight"
    DONE = "done"
    UNKNOWN = "unknown"


_TRANSITIONS = {
    BatchState.OPEN: {BatchState.QUEUED, BatchState.DONE},
    BatchState.QUEUED: {BatchState.IN_FLIGHT, BatchState.DONE},
    BatchState.IN_FLIGHT: {BatchState.QUEUED, BatchState.DONE},
    BatchState.DONE: set(),
    BatchState.UNKNOWN: set(),
}


class ProducerBatch:
    """One partition's batch: its builder while open, its encoded bytes once closed."""

    __slots__ = (
        "attempts",
        "builder",
        "created",
        "deadline",
        "partition",
        "payload",
        "producer",
        "record_count",
        "result",
        "retry_at",
        "seq",
        "size",
        "state",
    )

    def __init__(
        self, topic: str, partition: int, created: float, deadline: float, seq: int = 0, codec: int = 0
    ) -> None:
        self.partition = partition
        #: Creation order within the producer; queues are kept sorted by it.
        self.seq = seq
        #: ``codec``: the compression codec id; the batch is compressed once, in ``encode``.
        self.builder: BatchBuilder | None = BatchBuilder(codec)
        self.result = BatchResult(topic, partition)
        self.created = created
        self.deadline = deadline
        self.attempts = 0
        self.retry_at = 0.0
        self.payload: bytes | None = None
        #: (producer id, epoch, first sequence) under idempotence (idempotence.py); all -1 otherwise.
        self.producer: tuple[int, int, int] = (-1, -1, -1)
        self.size = 0
        self.record_count = 0
        self.state = BatchState.OPEN

    def transition(self, new: BatchState) -> None:
        if new not in _TRANSITIONS[self.state]:
            raise AssertionError(f"batch of partition {self.partition}: {self.state.value} -> {new.value}")
        self.state = new

    def encode(self) -> bytes:
        """Encode once (on first send); retries resend the same bytes.

        Caller: the sender thread, without the producer lock (the batch is closed, so
        no one appends to it any more).
        """
        if self.payload is None:
            assert self.builder is not None
            self.payload = self.builder.build(self.producer)
            self.builder = None
        return self.payload

    def __repr__(self) -> str:
        return f"<ProducerBatch p={self.partition} records={self.record_count} {self.state.value}>"


class Accumulator:
    """Open, queued and in-flight batches of one topic's partitions.

    Caller: Producer.send (``open`` / ``roll``; hot path), Producer.flush/close and the
    sender (``ready``, ``drain``, ``complete``, ``reenqueue``, ``expire``, ``abort``).
    Affects: the batches and the ``buffered`` byte count that bounds memory.
    """

    def __init__(
        self,
        topic: str,
        partitions: int,
        partitioner: Partitioner,
        *,
        batch_size: int,
        linger: float,
        delivery_timeout: float,
        clock: Callable[[], float],
        codec: int = 0,
        max_in_flight_batches: int = 1,
    ) -> None:
        self.topic = topic
        #: 1: one run in flight per partition; more: that many batches pipelined (module docstring).
        self.max_in_flight_batches = max_in_flight_batches
        #: The compression codec id of every batch (``ProducerConfig.compression``).
        self.codec = codec
        self.partitions = partitions
        self.partitioner = partitioner
        self.batch_size = batch_size
        self.linger = linger
        self.delivery_timeout = delivery_timeout
        self.clock = clock
        #: The open batch of each partition; read on the producer's hot path.
        self.open: list[ProducerBatch | None] = [None] * partitions
        self._queues: list[deque[ProducerBatch]] = [deque() for _ in range(partitions)]
        #: Per partition, its batches in flight in creation (so sequence) order.
        self._in_flight: list[list[ProducerBatch]] = [[] for _ in range(partitions)]
        #: Per partition: a batch failed while others were in flight; nothing goes out until they are back.
        self._blocked = [False] * partitions
        #: The most batches of one partition ever in flight at once (how far pipelining went).
        self.in_flight_peak = 0
        #: Bytes of closed batches not yet completed (queued or in flight).
        self.buffered = 0
        #: flush() calls in progress: while > 0, open batches are ready at once.
        self.flushing = 0
        #: close() started: open batches are ready at once.
        self.closing = False
        #: A send() waits for buffer space: open batches are ready at once to free it.
        self.waiting_for_space = 0
        self._drain_start = 0
        self._seq = 0

    # ---- producer side (hot path) ----------------------------------------------------

    def roll(self, partition: int) -> ProducerBatch:
        """Close the partition's open batch (if any) and open a new one.

        Caller: Producer.send when the record does not fit in the open batch.
        """
        self.close_open(partition)
        now = self.clock()
        self._seq += 1
        batch = ProducerBatch(self.topic, partition, now, now + self.delivery_timeout, self._seq, self.codec)
        self.open[partition] = batch
        return batch

    def close_open(self, partition: int) -> None:
        """Close the partition's open batch (if any): it is queued for sending."""
        batch = self.open[partition]
        if batch is None:
            return
        self.open[partition] = None
        assert batch.builder is not None
        batch.size = batch.builder.size
        batch.record_count = len(batch.builder)
        batch.transition(BatchState.QUEUED)
        self._queues[partition].append(batch)
        self.buffered += batch.size
        self.partitioner.on_batch_closed(partition, self._busy)

    def held(self) -> int:
        """Bytes counted against ``buffer_memory``: queued and in-flight batches, plus a whole
        ``batch_size`` per open batch (Kafka allocates an open batch whole; counting only what
        it took so far let every partition's open batch grow past the bound). The slow path
        only (a batch rolls): a walk over the open batches."""
        open_batches = sum(1 for b in self.open if b is not None)
        return self.buffered + open_batches * self.batch_size

    def _busy(self, partition: int) -> bool:
        return bool(self._in_flight[partition] or self._queues[partition])

    # ---- sender side -------------------------------------------------------------------

    def ready(self, now: float) -> tuple[list[int], float | None]:
        """Partitions with a batch to send now, and when the next one becomes ready.

        A partition is ready when it has room in flight (``_room``) and its head batch is
        queued (and past its retry backoff), or its open batch lingered long enough
        (or a flush, close or blocked send() wants everything out now).
        """
        hurry = self.flushing > 0 or self.closing or self.waiting_for_space > 0
        ready: list[int] = []
        next_at: float | None = None
        for p in range(self.partitions):
            if not self._room(p):
                continue
            q = self._queues[p]
            if q:
                at = q[0].retry_at
            else:
                b = self.open[p]
                if b is None or (self._in_flight[p] and not hurry):
                    # A partial batch of a partition with batches in flight waits for their answers
                    # (Nagle's rule; full batches, queued above, still pipeline). Kafka sends it at
                    # its linger; here every request costs the producer and each replica a Python
                    # round, so at linger 0 pipelining one-record requests cost more than it saved
                    # (docs/producer.md, "Ordering and pipelining"). The answer re-checks readiness.
                    continue
                at = now if hurry else b.created + self.linger
            if at <= now:
                ready.append(p)
            elif next_at is None or at < next_at:
                next_at = at
        return ready, next_at

    def _room(self, p: int) -> int:
        """How many more batches of partition ``p`` may go in flight now (0: none)."""
        flying = len(self._in_flight[p])
        if self.max_in_flight_batches == 1:
            return 0 if flying else 1 << 30  # one run, of any length
        if flying and self._blocked[p]:
            return 0
        return self.max_in_flight_batches - flying

    def drain(self, partitions: list[int], max_bytes: int) -> list[ProducerBatch]:
        """Take the queued batches of ``partitions`` (ready ones), up to ``max_bytes`` in total.

        A partition whose queue is empty contributes its open batch (it is ready, so it
        lingered long enough). Several batches of one partition may go in one request
        (a backlog ships in one round trip, up to the partition's room in flight); they are appended
        in order. A run that starts with a retried batch takes only retried batches (only that one
        when batches are pipelined): the broker then holds all of it or none of it, so an idempotent
        retry is answered as duplicates throughout, never half duplicate and half new. The start
        rotates between calls so no partition is starved when requests fill up. Always takes at least
        one batch. Taken batches are IN_FLIGHT. Returns them grouped by partition, in order.
        """
        out: list[ProducerBatch] = []
        total = 0
        n = len(partitions)
        if n == 0:
            return out
        start = self._drain_start % n
        self._drain_start += 1
        for i in range(n):
            p = partitions[(start + i) % n]
            room = self._room(p)
            if not room:
                continue
            q = self._queues[p]
            if not q:
                self.close_open(p)
            run: list[ProducerBatch] = []
            retry_at = q[0].retry_at if q else 0.0
            retrying = bool(q) and q[0].attempts > 0
            if retrying and self.max_in_flight_batches > 1:
                room = 1
            while q and len(run) < room:
                head = q[0]
                if head.retry_at > retry_at or ((out or run) and total + head.size > max_bytes):
                    break
                if run and retrying and head.attempts == 0:
                    break
                q.popleft()
                head.transition(BatchState.IN_FLIGHT)
                head.attempts += 1
                run.append(head)
                total += head.size
            if run:
                flying = self._in_flight[p]
                flying += run
                self.in_flight_peak = max(self.in_flight_peak, len(flying))
                out += run
            if total >= max_bytes:
                break
        return out

    def complete(self, batch: ProducerBatch) -> None:
        """The batch is done (acknowledged or failed): release its memory (and its partition
        once the partition's whole in-flight run is done)."""
        if batch.state is BatchState.IN_FLIGHT:
            self._leave_flight(batch)
        batch.transition(BatchState.DONE)
        self.buffered -= batch.size

    def reenqueue(self, batch: ProducerBatch, retry_at: float) -> None:
        """Put an in-flight batch back in its partition's queue (in creation order, so
        ahead of newer batches), to resend at ``retry_at``. The partition sends nothing more until
        its other batches in flight are back."""
        self.hold(batch.partition)
        self._leave_flight(batch)
        batch.transition(BatchState.QUEUED)
        batch.retry_at = retry_at
        q = self._queues[batch.partition]
        i = 0
        while i < len(q) and q[i].seq < batch.seq:
            i += 1
        q.insert(i, batch)

    def hold(self, partition: int) -> None:
        """Send nothing more of ``partition`` until its batches in flight now are back (a failure among
        them: what follows must wait to go in order)."""
        self._blocked[partition] = bool(self._in_flight[partition])

    def _leave_flight(self, batch: ProducerBatch) -> None:
        flying = self._in_flight[batch.partition]
        assert batch in flying, f"{batch!r} is not in flight"
        flying.remove(batch)
        if not flying:
            self._blocked[batch.partition] = False

    def sent_before(self, batch: ProducerBatch) -> bool:
        """Whether an older batch of ``batch``'s partition is still unacknowledged (queued for a retry or
        in flight): an OUT_OF_ORDER_SEQUENCE on ``batch`` is then that batch's failure echoed, not a gap."""
        p = batch.partition
        return any(b.seq < batch.seq for b in self._in_flight[p]) or any(
            b.seq < batch.seq and b.attempts > 0 for b in self._queues[p]
        )

    def unacknowledged(self, partition: int) -> list[ProducerBatch]:
        """The partition's batches sent at least once and not done: in flight or queued for a retry."""
        return self._in_flight[partition] + [b for b in self._queues[partition] if b.attempts > 0]

    def expire(self, now: float) -> list[ProducerBatch]:
        """Remove and return open or queued batches whose delivery timeout has passed.

        In-flight batches are left to their request's own timeout.
        """
        expired: list[ProducerBatch] = []
        for p in range(self.partitions):
            q = self._queues[p]
            # Queues are in creation order (a retried batch returns to the head, and it
            # is the oldest), so expired batches are always at the head.
            while q and q[0].deadline <= now:
                expired.append(q.popleft())
            b = self.open[p]
            if b is not None and b.deadline <= now:
                self.close_open(p)
                expired.append(self._queues[p].pop())
        for b in expired:
            b.transition(BatchState.DONE)
            self.buffered -= b.size
        return expired

    def next_expiry(self) -> float | None:
        """The earliest delivery deadline of an open or queued batch (None if there is none):
        the sender wakes then to fail what nothing else would wake it for."""
        best: float | None = None
        for p in range(self.partitions):
            q = self._queues[p]
            for b in (q[0] if q else None, self.open[p]):
                if b is not None and (best is None or b.deadline < best):
                    best = b.deadline
        return best

    def abort(self, include_in_flight: bool) -> list[ProducerBatch]:
        """Remove and return every open and queued batch (and in-flight ones if asked)."""
        out: list[ProducerBatch] = []
        for p in range(self.partitions):
            self.close_open(p)
            q = self._queues[p]
            out.extend(q)
            q.clear()
            if include_in_flight:
                out += self._in_flight[p]
                self._in_flight[p] = []
                self._blocked[p] = False
        for b in out:
            b.transition(BatchState.DONE)
            self.buffered -= b.size
        return out

    # ---- queries -------------------------------------------------------------------------

    def batches(self) -> Iterator[ProducerBatch]:
        """Every batch not yet done: open, queued and in flight."""
        for p in range(self.partitions):
            b = self.open[p]
            if b is not None:
                yield b
            yield from self._queues[p]
            yield from self._in_flight[p]

    def in_flight(self, partition: int) -> list[ProducerBatch]:
        return list(self._in_flight[partition])

    def queued(self, partition: int) -> list[ProducerBatch]:
        return list(self._queues[partition])

    @property
    def empty(self) -> bool:
        return not any(True for _ in self.batches())
