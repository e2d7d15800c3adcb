"""The batch codec under structured-but-wrong input: every reader either refuses with a typed error or
returns exactly what the batch declares. Never ``struct.error``, ``IndexError``, ``UnicodeDecodeError``,
``MemoryError`` or a record count that disagrees with the header.

The readers are the ones a hostile producer (``validate_batch``, on the broker) or a damaged disk
(``decode_records``, ``batch_views``, ``filter_batch``, on consumers, followers and the dispatcher) can
reach. ``max_examples`` is left to the Hypothesis profile, so ``bench/fuzz/run.py`` can run the same
properties far longer.
"""

from __future__ import annotations

import contextlib

from hypothesis import given

from sluice.codec import batch as b
from sluice.errors import (
    BatchTooLarge,
    CorruptBatch,
    LimitExceeded,
    UnsupportedCompression,
    UnsupportedVersion,
)
from tests.unit.fuzz.strategies import RecordTuple, broken_batch, records_st

LIMIT = 1 << 20
#: What a reader may raise for bad bytes: the typed errors, nothing else.
TYPED = (CorruptBatch, BatchTooLarge, UnsupportedVersion, LimitExceeded, UnsupportedCompression)


@given(broken_batch())
def test_validation_refuses_typed_or_accepts_a_batch_every_reader_agrees_with(raw: bytes) -> None:
    try:
        header = b.validate_batch(raw, 0, LIMIT, require_dense=True, headers=b.DEFAULT_HEADER_LIMITS)
    except TYPED:
        return
    # Accepted: then the batch is self-consistent, and every reader must see the same records.
    records = b.decode_records(raw, "t", 0)
    assert len(records) == header.record_count
    assert [r.offset for r in records] == list(range(header.record_count))
    (view,) = b.batch_views(raw)
    assert view.header == header
    tags = frozenset(t for r in records if r.tag is not None for t in [r.tag])
    kept = b.filter_batch(raw, 0, header, tags)
    if tags:
        assert kept is not None
        assert len(b.decode_records(kept, "t", 0)) == sum(r.tag is not None for r in records)


@given(broken_batch())
def test_readers_without_validation_fail_typed(raw: bytes) -> None:
    """Consumers decode what the broker served without re-validating columns; a damaged disk under a
    CRC that still matches (a bug, or ``verify_crc=False``) must still give a typed error."""
    with contextlib.suppress(*TYPED):
        b.decode_records(raw, "t", 0)
    with contextlib.suppress(*TYPED):
        b.decode_records(raw, "t", 0, verify_crc=False)
    with contextlib.suppress(*TYPED):
        for view in b.batch_views(raw, verify_crc=False):
            b.filter_batch(view.buf, 0, view.header, frozenset({"a"}))


@given(records_st)
def test_every_valid_batch_validates_and_round_trips(records: list[RecordTuple]) -> None:
    raw = b.encode_records(records)
    header = b.validate_batch(raw, 0, LIMIT, require_dense=True, headers=b.DEFAULT_HEADER_LIMITS)
    decoded = b.decode_records(raw, "t", 0)
    assert header.record_count == len(records) == len(decoded)
    assert [(r.value, r.key, r.tag) for r in decoded] == [(v, k, t) for v, k, t, _, _ in records]
