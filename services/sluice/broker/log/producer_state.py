"""Idempotent producers on one partition: the batches each producer wrote last, so a retried batch is
written once and a gap is refused.

The model is Kafka's (``ProducerStateManager``): a producer has an id and an epoch from the coordinator and
numbers its records per partition from 0 (``base_sequence`` in the batch header, wrapping at 2**31). The
partition remembers, per producer id, its epoch and its last :data:`BATCHES_KEPT` batches. A batch is

- a **duplicate** when it is one of those batches (a retry whose first answer was lost): it is not appended
  again, and the answer names the offsets it got the first time;
- **in order** when it starts right after the last one (or at 0 under a newer epoch): it is appended;
- refused otherwise: ``OUT_OF_ORDER_SEQUENCE`` (a gap, or a retry older than what is remembered),
  ``INVALID_PRODUCER_EPOCH`` (an older epoch: a newer instance of the producer fenced this one),
  ``UNKNOWN_PRODUCER_ID`` (no state for the id and the batch does not start a sequence: the state expired
  or was evicted; the producer starts again under a new epoch).

Why five batches: the producer keeps at most five requests in flight per partition with idempotence on
(Kafka's ``max.in.flight.requests.per.connection`` bound), so any retry it can send is among them.

**Bounded.** Every Spark task is a new producer, and an unbounded table is how Kafka brokers ran out of memory
once idempotence became the default (KIP-854, KIP-936). An entry expires ``expiration_ms`` after its last
batch's append time (the leader's clock, stamped in the batch, so every replica expires the same entries), and
a table holds at most ``max_producers`` ids: a new id beyond that evicts the least recently used one, which
then gets ``UNKNOWN_PRODUCER_ID`` and starts again; the evictions are counted so operators see the cap bite.

**Durable.** The state is derived from the log (every batch header carries its producer fields), so it is
rebuilt on open by replaying batch headers, never records. Snapshots (``snapshot.py``) bound that replay: the
table at an offset, checksummed, written at segment roll and clean shutdown.

Pure: no I/O, no clock (callers pass times). One thread uses a table (the partition log's owner).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from sluice.errors import InvalidProducerEpoch, OutOfOrderSequence, UnknownProducerId

#: ``producer_id`` of a batch from a producer without idempotence: no state, no checks.
NO_PRODUCER_ID = -1
SEQUENCE_MODULUS = 2**31
BATCHES_KEPT = 5
DEFAULT_EXPIRATION_MS = 24 * 3600 * 1000  # Kafka's producer.id.expiration.ms
DEFAULT_MAX_PRODUCERS = 10_000


def last_sequence(first_sequence: int, record_count: int) -> int:
    """The sequence of a batch's last record (sequences wrap at 2**31, as Kafka's)."""
    return (first_sequence + record_count - 1) % SEQUENCE_MODULUS


@dataclass(frozen=True, slots=True)
class BatchMeta:
    """What the partition remembers of one batch: enough to recognise a retry and answer it."""

    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    append_time_ms: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    batches: deque[BatchMeta] = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))

    @property
    def last_append_ms(self) -> int:
        return self.batches[-1].append_time_ms if self.batches else -1

    def find(self, first_sequence: int, last_seq: int) -> BatchMeta | None:
        for meta in self.batches:
            if meta.first_sequence == first_sequence and meta.last_sequence == last_seq:
                return meta
        return None


class ProducerStateTable:
    """The producer entries of one partition, least recently appended first."""

    def __init__(
        self,
        expiration_ms: int = DEFAULT_EXPIRATION_MS,
        max_producers: int = DEFAULT_MAX_PRODUCERS,
    ) -> None:
        if expiration_ms <= 0 or max_producers <= 0:
            raise ValueError("expiration_ms and max_producers must be positive")
        self.expiration_ms = expiration_ms
        self.max_producers = max_producers
        #: Insertion order is recency order: ``record`` moves an entry to the end.
        self._entries: OrderedDict[int, ProducerEntry] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._entries.get(producer_id)

    def entries(self) -> list[ProducerEntry]:
        return list(self._entries.values())

    def check(self, producer_id: int, epoch: int, first_sequence: int, record_count: int) -> BatchMeta | None:
        """Before an append: the earlier write of this batch if it is a retry, None if it is to be appended.

        Raises the typed error that refuses it otherwise. Changes nothing.
        """
        if producer_id == NO_PRODUCER_ID:
            return None
        if not 0 <= first_sequence < SEQUENCE_MODULUS or record_count <= 0:
            raise OutOfOrderSequence(f"producer {producer_id}: invalid sequence {first_sequence}")
        entry = self._entries.get(producer_id)
        if entry is None:
            if first_sequence != 0:
                raise UnknownProducerId(
                    f"producer {producer_id} is not known here (its state expired or was evicted) and the "
                    f"batch starts at sequence {first_sequence}: start again at 0 under a new epoch"
                )
            return None
        if epoch < entry.epoch:
            raise InvalidProducerEpoch(
                f"producer {producer_id} epoch {epoch} is fenced by epoch {entry.epoch} on this partition"
            )
        if epoch > entry.epoch:
            if first_sequence != 0:
                raise OutOfOrderSequence(
                    f"producer {producer_id}: a new epoch {epoch} must start at sequence 0, "
                    f"got {first_sequence}"
                )
            return None
        duplicate = entry.find(first_sequence, last_sequence(first_sequence, record_count))
        if duplicate is not None:
            return duplicate
        expected = (entry.batches[-1].last_sequence + 1) % SEQUENCE_MODULUS if entry.batches else 0
        if first_sequence != expected:
            raise OutOfOrderSequence(
                f"producer {producer_id} epoch {epoch}: expected sequence {expected}, got {first_sequence}"
            )
        return None

    def record(
        self,
        producer_id: int,
        epoch: int,
        first_sequence: int,
        record_count: int,
        first_offset: int,
        last_offset: int,
        append_time_ms: int,
    ) -> None:
        """After an append (or a replay of the log): remember the batch. No checks: the log is the truth."""
        if producer_id == NO_PRODUCER_ID:
            return
        entry = self._entries.get(producer_id)
        if entry is None:
            self._make_room()
            entry = self._entries[producer_id] = ProducerEntry(producer_id, epoch)
        else:
            self._entries.move_to_end(producer_id)
        if epoch != entry.epoch:
            # A new epoch starts a new sequence: the old epoch's batches can no longer be retried.
            entry.epoch = epoch
            entry.batches.clear()
        entry.batches.append(
            BatchMeta(
                first_sequence,
                last_sequence(first_sequence, record_count),
                first_offset,
                last_offset,
                append_time_ms,
            )
        )

    def _make_room(self) -> None:
        while len(self._entries) >= self.max_producers:
            self._entries.popitem(last=False)
            self.evictions += 1

    def expire(self, now_ms: int) -> int:
        """Drop entries whose last batch was appended more than ``expiration_ms`` ago; how many went.

        Cheap when nothing expires: the oldest entry comes first, so the walk stops at the first live one.
        """
        expired = 0
        deadline = now_ms - self.expiration_ms
        while self._entries:
            producer_id, entry = next(iter(self._entries.items()))
            if entry.last_append_ms >= deadline:
                break
            del self._entries[producer_id]
            expired += 1
        return expired

    def truncate_to(self, offset: int) -> None:
        """Forget batches at or above ``offset`` (the log was cut back there); an entry left empty goes.

        An entry that lost only its newest batches keeps the older ones, so a retry of a batch that was cut
        off is appended again rather than answered as a duplicate.
        """
        for producer_id in list(self._entries):
            entry = self._entries[producer_id]
            while entry.batches and entry.batches[-1].last_offset >= offset:
                entry.batches.pop()
            if not entry.batches:
                del self._entries[producer_id]

    def restore(self, entries: list[ProducerEntry]) -> None:
        """Replace the table with ``entries`` (from a snapshot), oldest first."""
        self._entries.clear()
        for entry in sorted(entries, key=lambda e: e.last_append_ms):
            self._entries[entry.producer_id] = entry
