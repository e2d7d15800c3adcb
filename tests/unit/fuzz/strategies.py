"""Shared strategies of the offline fuzz properties: valid inputs first, then wrong ones built from them.

Random bytes rarely get past a CRC or a magic byte, so most of a decoder is never reached by them. The
strategies here start from something valid (a batch that encodes, a filter that parses) and break one
thing at a time, re-sealing what a checksum would otherwise reject, so the checks *behind* the first
one are exercised too: the fuzzing style of the issue ("structured but wrong", not only random bytes).
"""

from __future__ import annotations

import struct

from hypothesis import strategies as st

from sluice.codec import batch as b

#: (value, key, tag, headers, timestamp_ms), what ``encode_records`` takes.
RecordTuple = tuple[bytes, bytes | None, str | None, dict[str, bytes] | None, int]

record_st = st.tuples(
    st.binary(max_size=32),
    st.one_of(st.none(), st.binary(max_size=8)),
    st.one_of(st.none(), st.sampled_from(["a", "b", "c.d"])),
    st.one_of(st.none(), st.dictionaries(st.text(max_size=4), st.binary(max_size=6), max_size=3)),
    st.integers(min_value=0, max_value=2**40),
)
records_st = st.lists(record_st, min_size=1, max_size=12)

_CRC = struct.Struct("<I")


def reseal(raw: bytearray) -> None:
    """Recompute the CRC over the batch's covered bytes, as a careful attacker (or a bug) would."""
    (length,) = struct.unpack_from("<i", raw, 8)
    end = min(max(length, b.CRC_START), len(raw))
    _CRC.pack_into(raw, b.CRC_AT, b.crc32c(raw[b.CRC_START : end]))


#: Header fields worth lying about, as (offset, struct format): attributes, producer fields, counts,
#: timestamps and the tag table's length.
HEADER_FIELDS = [
    (8, "<i"),  # batch_length
    (24, "<B"),  # magic
    (29, "<B"),  # attributes
    (30, "<q"),  # producer_id
    (38, "<h"),  # producer_epoch
    (40, "<i"),  # base_sequence
    (44, "<i"),  # record_count
    (48, "<i"),  # last_offset_delta
    (52, "<q"),  # base_timestamp
    (60, "<q"),  # max_timestamp
    (68, "<I"),  # tag_table_length
]

_LIMITS = {"<B": (0, 255), "<h": (-(2**15), 2**15 - 1), "<i": (-(2**31), 2**31 - 1)}
_LIMITS |= {"<I": (0, 2**32 - 1), "<q": (-(2**63), 2**63 - 1)}


@st.composite
def header_lie(draw: st.DrawFn) -> tuple[int, str, int]:
    """A header field and a value for it: small and edge values most often, any value sometimes."""
    at, fmt = draw(st.sampled_from(HEADER_FIELDS))
    lo, hi = _LIMITS[fmt]
    edges = [v for v in (-1, 0, 1, 2, 3, 72, 255, 65535, 2**31 - 1, lo, hi) if lo <= v <= hi]
    value = draw(st.one_of(st.sampled_from(edges), st.integers(lo, hi)))
    return at, fmt, value


@st.composite
def broken_batch(draw: st.DrawFn) -> bytes:
    """A valid batch with one to three things wrong in it, re-sealed so the CRC still passes."""
    raw = bytearray(b.encode_records(draw(records_st)))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["header", "byte", "cut", "extend"]))
        if kind == "header":
            at, fmt, value = draw(header_lie())
            struct.pack_into(fmt, raw, at, value)
        elif kind == "byte" and len(raw) > b.CRC_START:
            at = draw(st.integers(b.CRC_START, len(raw) - 1))
            raw[at] = draw(st.integers(0, 255))
        elif kind == "cut" and len(raw) > b.HEADER_SIZE + 1:
            del raw[draw(st.integers(b.HEADER_SIZE, len(raw) - 1)) :]
        elif kind == "extend":
            raw += draw(st.binary(min_size=1, max_size=16))
    if draw(st.booleans()):
        reseal(raw)
    return bytes(raw)
