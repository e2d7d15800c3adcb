"""The idempotent producer's side: a producer id and epoch, and a sequence per partition.

With idempotence on (the default, as in Kafka 3), every batch carries the producer's id and epoch and the
sequence of its first record in its partition (docs/replication.md, "Idempotent producer"). The broker keeps
the last five batches of each producer per partition, so a retry after a lost answer is recognised and
answered with the offsets of its first write instead of being appended twice.

The rules this module keeps:

- A batch gets its sequence when it is first drained (under the producer's lock, in partition order) and
  keeps it, and its encoded bytes, across retries: a retry must be byte-identical to be recognised.
- Up to ``max_in_flight`` (at most 5) batches of a partition are in flight at once, pipelined
  (``Accumulator``, Kafka's rule); a retried batch is sent alone in its run (``Accumulator.drain``), so the
  broker answers it as a whole duplicate (with the offsets of its first write) or appends it whole. The
  broker keeps the last five batches per producer, so every batch that can be retried is recognised.
- ``UNKNOWN_PRODUCER_ID`` (the broker forgot the producer: its state expired or was evicted) restarts the
  partition's sequence at 0, which the broker accepts for a producer it does not know, and its unacknowledged
  batches are sent again, re-stamped in order: nothing of them can be on the broker under the forgotten
  state's sequences.
- ``OUT_OF_ORDER_SEQUENCE`` on a batch while an older batch of its partition is unacknowledged is that
  batch's failure echoed (the broker refused the gap it left): it is retried, in order, after the older one
  (``echoed_gap``). On the oldest unacknowledged batch it is a real gap (the broker lost batches it had
  acknowledged, e.g. to an unclean election): the batch fails with that error, and the producer moves to a
  new epoch (``InitProducerId`` with its id), restarting every partition at sequence 0; the partition's
  batches in flight behind it are retried under the new epoch. Later records flow again, and the failure is
  visible. A batch failing for good while later ones fly leaves the same gap, handled the same way.
- ``INVALID_PRODUCER_EPOCH`` means another instance took over this id: the batch fails; it is fatal.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.client.metadata import MetadataCache, call_with_retry
from sluice.client.producer.accumulator import ProducerBatch
from sluice.client.rpc import call
from sluice.codec.batch import restamp_producer
from sluice.v1 import coordinator_pb2

__all__ = ["Idempotence", "init_producer_id"]

SEQUENCE_MODULUS = 2**31


@dataclass(frozen=True, slots=True)
class Identity:
    producer_id: int
    producer_epoch: int


def init_producer_id(
    metadata: MetadataCache, client_id: str, timeout: float, current: Identity | None = None
) -> Identity:
    """Ask the coordinator for a new id, or for ``current``'s id under the next epoch."""
    request = coordinator_pb2.InitProducerIdRequest(
        client_id=client_id,
        producer_id=current.producer_id if current else -1,
        producer_epoch=current.producer_epoch if current else -1,
    )
    resp = call_with_retry(
        lambda: call(metadata.coordinator_stub().InitProducerId, request, timeout), timeout
    )
    return Identity(resp.producer_id, resp.producer_epoch)


class Idempotence:
    """The producer's identity and per-partition sequences. Every method but ``new_epoch`` runs with the
    producer's lock held."""

    def __init__(self, identity: Identity, partitions: int) -> None:
        self.identity = identity
        self._next = [0] * partitions
        #: Set after OUT_OF_ORDER_SEQUENCE: no batch is sent until the sender has moved to a new epoch.
        self.needs_new_epoch = False
        #: Per partition: the (id, epoch) under which it has a gap; its later batches under it are retried.
        self._gapped: dict[int, tuple[int, int]] = {}

    def stamp(self, batch: ProducerBatch) -> None:
        """Give a batch drained for sending its sequence, unless it already has one under this identity
        (a retry keeps its sequence and bytes)."""
        pid, epoch = self.identity.producer_id, self.identity.producer_epoch
        if batch.producer[0] == pid and batch.producer[1] == epoch and batch.producer[2] >= 0:
            return
        p = batch.partition
        sequence = self._next[p]
        self._next[p] = (sequence + batch.record_count) % SEQUENCE_MODULUS
        batch.producer = (pid, epoch, sequence)
        if batch.payload is not None:
            batch.payload = restamp_producer(batch.payload, batch.producer)

    def forget_partition(self, partition: int, unacknowledged: list[ProducerBatch]) -> None:
        """UNKNOWN_PRODUCER_ID: the partition starts over at sequence 0 with its unacknowledged batches
        (re-stamped, in order, when they are drained again)."""
        self._next[partition] = 0
        for batch in unacknowledged:
            batch.producer = (-1, -1, -1)

    def echoed_gap(self, batch: ProducerBatch, older_unacknowledged: bool) -> bool:
        """OUT_OF_ORDER_SEQUENCE on ``batch``: True if it only echoes an older batch's failure (retry it in
        order); False for a real gap, which the caller fails and reports with ``gap``."""
        return older_unacknowledged or self._gapped.get(batch.partition) == batch.producer[:2]

    def gap(self, batch: ProducerBatch) -> None:
        """``batch`` is missing for good from its partition's sequence: the batches stamped after it can
        never be appended under this epoch; they are retried under the next one."""
        self._gapped[batch.partition] = (batch.producer[0], batch.producer[1])
        self.needs_new_epoch = True

    def new_epoch(self, metadata: MetadataCache, client_id: str, timeout: float) -> Identity:
        """The same id under the next epoch (without the lock; the caller installs it with ``adopt``)."""
        return init_producer_id(metadata, client_id, timeout, self.identity)

    def adopt(self, identity: Identity) -> None:
        """Every partition starts over at sequence 0 under ``identity`` (batches are stamped when drained)."""
        self.identity = identity
        self._next = [0] * len(self._next)
        self.needs_new_epoch = False
