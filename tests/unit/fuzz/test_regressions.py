"""What the offline fuzz properties found, pinned as plain examples (each fails without its fix)."""

from __future__ import annotations

import struct

import pytest

from sluice.codec import batch as b
from sluice.common.units import parse_duration
from sluice.errors import CorruptBatch, InvalidArgument
from tests.unit.fuzz.strategies import reseal


def _batch_with_broken_headers() -> bytes:
    raw = bytearray(b.encode_records([(b"v", b"k", None, {"h": b"12"}, 1)]))
    # The headers blob is the batch's last bytes: u16 count, u16 name length, name, u32 value length,
    # value. Claim a 3-byte value where 2 are: still within the batch, CRC re-sealed.
    struct.pack_into("<I", raw, len(raw) - 2 - 4, 3)
    reseal(raw)
    return bytes(raw)


def test_the_broker_refuses_a_batch_whose_headers_a_consumer_cannot_parse() -> None:
    raw = _batch_with_broken_headers()
    with pytest.raises(CorruptBatch, match="header"):
        b.validate_batch(raw, 0, 1 << 20, require_dense=True, headers=b.DEFAULT_HEADER_LIMITS)


def test_a_malformed_batch_read_without_validation_is_corrupt_not_a_key_error() -> None:
    raw = bytearray(b.encode_records([(b"v", None, "t", None, 1)]))
    tag_index_at = len(raw) - 1 - 2  # the last column (u16 tag index) precedes the 1-byte value
    struct.pack_into("<H", raw, tag_index_at, 7)  # only tag 0 exists
    reseal(raw)
    with pytest.raises(CorruptBatch):
        b.decode_records(bytes(raw), "t", 0)


def test_an_out_of_range_duration_is_a_typed_error() -> None:
    with pytest.raises(InvalidArgument, match="out of range"):
        parse_duration("99999999999999999999")


def test_a_config_path_with_a_nul_byte_is_a_typed_error() -> None:
    """``sluice offset-store --config $'\\x00'`` printed a ValueError traceback (found by bench/fuzz)."""
    from sluice.offsetstore.main import parse_config

    with pytest.raises(InvalidArgument, match="cannot read config file"):
        parse_config(["--config", "\x00"])
