"""The idempotent producer's stamping: sequences per partition in drain order, kept across retries,
restarted on UNKNOWN_PRODUCER_ID and under a new epoch; re-stamped batches stay valid."""

from __future__ import annotations

import pytest

from sluice.client.producer.accumulator import ProducerBatch
from sluice.client.producer.idempotence import Idempotence, Identity
from sluice.codec.batch import BatchBuilder, read_header, restamp_producer, validate_batch
from sluice.errors import CorruptBatch


def _batch(partition: int, records: int) -> ProducerBatch:
    batch = ProducerBatch("t", partition, 0.0, 60.0)
    assert batch.builder is not None
    for i in range(records):
        batch.builder.append(f"v{i}".encode(), None, None, None, 1_000 + i)
    batch.record_count = records
    return batch


def _fields(batch: ProducerBatch) -> tuple[int, int, int]:
    h = read_header(batch.encode())
    return h.producer_id, h.producer_epoch, h.base_sequence


def test_sequences_follow_records_per_partition_and_retries_keep_theirs() -> None:
    idem = Idempotence(Identity(42, 3), partitions=2)
    a, b, c = _batch(0, 3), _batch(0, 2), _batch(1, 4)
    for batch in (a, c, b):
        idem.stamp(batch)
    assert [_fields(x) for x in (a, b, c)] == [(42, 3, 0), (42, 3, 3), (42, 3, 0)]
    sent = a.encode()
    idem.stamp(a)  # drained again for a retry
    assert a.encode() is sent


def test_an_unknown_producer_restarts_the_partition_at_zero_with_the_same_batch() -> None:
    idem = Idempotence(Identity(42, 0), partitions=1)
    a = _batch(0, 3)
    idem.stamp(a)
    idem.stamp(_batch(0, 1))
    a.encode()
    idem.forget_partition(0, [a])
    idem.stamp(a)
    assert _fields(a) == (42, 0, 0)
    validate_batch(a.encode(), 0, 1 << 20)  # re-stamped, CRC recomputed


def test_a_new_epoch_restarts_every_partition_and_restamps_retries() -> None:
    idem = Idempotence(Identity(42, 0), partitions=2)
    a, b = _batch(0, 5), _batch(1, 2)
    idem.stamp(a)
    idem.stamp(b)
    a.encode()
    idem.adopt(Identity(42, 1))
    idem.stamp(b)
    idem.stamp(a)
    assert _fields(a) == (42, 1, 0)
    assert _fields(b) == (42, 1, 0)


def test_restamping_keeps_the_crc_valid_and_a_flipped_producer_bit_is_caught() -> None:
    builder = BatchBuilder()
    builder.append(b"value", b"k", None, None, 1_000)
    raw = restamp_producer(builder.build(), (7, 1, 99))
    validate_batch(raw, 0, 1 << 20)
    assert (read_header(raw).producer_id, read_header(raw).base_sequence) == (7, 99)
    damaged = bytearray(raw)
    damaged[31] ^= 1  # inside the producer id, which the CRC covers
    with pytest.raises(CorruptBatch):
        validate_batch(bytes(damaged), 0, 1 << 20)
