"""Lag in seconds reads a record's timestamp out of a compressed batch too (docs/compression.md)."""

from __future__ import annotations

from sluice.codec.batch import BatchBuilder, stamp
from sluice.codec.batch.compression import ZSTD
from sluice.coordinator.groups.lag import record_timestamp


def test_record_timestamp_inflates_a_compressed_batch() -> None:
    builder = BatchBuilder(ZSTD)
    for i, ts in enumerate([1_000, 1_005, 990]):
        builder.append(b"value-%d" % i, None, None, None, ts)
    data = bytearray(builder.build())
    stamp(data, 0, 10, 0, 0)
    records = bytes(data)
    # Without inflating, the columns would be read from the frame: garbage or a refusal, not these.
    assert [record_timestamp(records, o) for o in (10, 11, 12)] == [1_000, 1_005, 990]
    assert record_timestamp(records, 13) is None
    assert record_timestamp(records[:40] + b"\xff" * (len(records) - 40), 10) is None  # damaged: unknown
