"""The broker's filters over compressed batches (docs/compression.md, "Filtering a compressed batch"):
a batch is inflated only when its readable tag table or header summary cannot rule it out, and a batch whose
every record matches goes out as stored."""

from __future__ import annotations

import pytest

from sluice.broker.filtering import filter_chunk
from sluice.codec import batch as b
from sluice.codec.batch import compression as cz
from sluice.codec.sql_filter import compile_sql
from tests.unit.codec.test_compression import order_records, stamped

CODECS = [cz.GZIP, cz.LZ4, cz.ZSTD]


@pytest.mark.parametrize("codec", CODECS, ids=[cz.NAMES[c] for c in CODECS])
def test_broker_filters_inflate_only_what_they_must_and_pass_whole_batches_as_stored(codec: int) -> None:
    records = order_records(90)
    log = stamped(b.encode_records(records, codec=codec))
    tagged_b = filter_chunk(log, 0, frozenset({"b"}), 1 << 30, True)
    got = b.decode_records(b"".join(tagged_b.batches), "t", 0)
    assert [r.offset for r in got] == [i for i in range(90) if i % 3 == 1]
    assert tagged_b.next_offset == 90
    # Every record matches: the stored compressed bytes go out as they are (no inflated copy).
    everything = filter_chunk(log, 0, frozenset({"a", "b"}), 1 << 30, True)
    assert [r.offset for r in b.decode_records(b"".join(everything.batches), "t", 0)] == [
        i for i in range(90) if i % 3 != 2
    ]
    sql = filter_chunk(log, 0, frozenset(), 1 << 30, True, compile_sql("region = 'r1'"))
    assert [r.offset for r in b.decode_records(b"".join(sql.batches), "t", 0)] == [
        i for i in range(90) if i % 3 and i % 4 == 1
    ]
    all_sql = filter_chunk(log, 0, frozenset(), 1 << 30, True, compile_sql("status IS NULL"))
    assert all_sql.batches == [log]
    # Pruned by the header summary (readable): nothing inflated, nothing returned, the position moves on.
    pruned = filter_chunk(log, 0, frozenset(), 1 << 30, True, compile_sql("region = 'zz'"))
    assert (pruned.batches, pruned.next_offset) == ([], 90)
