"""Batch compression (docs/compression.md): each codec round-trips through every reader, the tag table
stays readable for pruning, and bad compressed input is a typed error that allocates nothing beyond the
declared size and the hard limit."""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from sluice.client.producer.config import ProducerConfig
from sluice.codec import batch as b
from sluice.codec.batch import compression as cz
from sluice.errors import (
    BatchTooLarge,
    CorruptBatch,
    InvalidArgument,
    LimitExceeded,
    UnsupportedCompression,
    UnsupportedVersion,
)
from tests.unit.fuzz.strategies import RecordTuple, records_st, reseal

LIMIT = 1 << 20
#: Every codec this install has: the slim SDK install (tests/packaging) runs this file without lz4.
CODECS = [c for c in (cz.GZIP, cz.LZ4, cz.ZSTD) if cz.is_available(c)]
TYPED = (CorruptBatch, BatchTooLarge, UnsupportedVersion, LimitExceeded, UnsupportedCompression)
#: Where the compressed section (u32 inflated length, then the frame) starts in a batch without tags.
_NO_TAGS_SECTION = b.HEADER_SIZE + 2


def order_records(n: int) -> list[RecordTuple]:
    out: list[RecordTuple] = []
    for i in range(n):
        value = json.dumps({"order": i, "status": ("paid", "shipped")[i % 2], "total": i * 1.25}).encode()
        headers = {"region": f"r{i % 4}".encode()} if i % 3 else None
        out.append((value, f"k{i}".encode() if i % 5 else None, ("a", "b", None)[i % 3], headers, 1000 + i))
    return out


def stamped(raw: bytes, base: int = 0) -> bytes:
    out = bytearray(raw)
    b.stamp(out, 0, base, 5, 0)
    return bytes(out)


@pytest.mark.parametrize("codec", CODECS, ids=[cz.NAMES[c] for c in CODECS])
def test_every_reader_sees_the_records_of_the_plain_batch(codec: int) -> None:
    records = order_records(300)
    plain = stamped(b.encode_records(records), 10)
    packed = stamped(b.encode_records(records, codec=codec), 10)
    assert len(packed) < len(plain) // 2
    h = b.validate_batch(packed, 0, LIMIT, require_dense=True, headers=b.DEFAULT_HEADER_LIMITS)
    assert (h.attributes, h.record_count) == (codec, 300)
    # The tag table is readable as it is: what the broker prunes by.
    assert b.read_tags(packed, 0, h) == b.read_tags(plain, 0, b.read_header(plain))
    expected = b.decode_records(plain, "t", 0, 12)
    assert b.decode_records(packed, "t", 0, 12) == expected
    assert b.decode_records(packed, "t", 0, 12, verify_crc=False) == expected
    (view,) = b.batch_views(packed)
    assert [view.record("t", 0, i) for i in range(len(view))][2:] == expected
    # The inflated batch is a valid plain batch: the dispatcher forwards it, the push SDK checks its CRC.
    assert b.batch_views(view.cut([(0, len(view))]))[0].offsets == view.offsets


@given(st.sampled_from(CODECS), records_st)
def test_any_records_round_trip(codec: int, records: list[RecordTuple]) -> None:
    raw = b.encode_records(records, codec=codec)
    b.validate_batch(raw, 0, LIMIT, require_dense=True, headers=b.DEFAULT_HEADER_LIMITS)
    assert b.decode_records(raw, "t", 0) == b.decode_records(b.encode_records(records), "t", 0)


@st.composite
def broken_compressed(draw: st.DrawFn) -> bytes:
    """A valid compressed batch with its section lied about: the declared size, frame bytes, the frame
    cut or extended, the codec bits; then usually re-sealed so the CRC passes and the inflater is reached."""
    codec = draw(st.sampled_from(CODECS))
    raw = bytearray(b.encode_records(draw(records_st), codec=codec))
    h = b.read_header(raw)
    section = b.HEADER_SIZE + h.tag_table_length
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["size", "byte", "cut", "extend", "codec"]))
        if kind == "size" and len(raw) >= section + 4:
            size = draw(st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 2**31, 2**32 - 1])))
            struct.pack_into("<I", raw, section, size)
        elif kind == "byte" and len(raw) > section + 4:
            raw[draw(st.integers(section + 4, len(raw) - 1))] = draw(st.integers(0, 255))
        elif kind == "cut" and len(raw) > section + 1:
            del raw[draw(st.integers(section, len(raw) - 1)) :]
            struct.pack_into("<i", raw, 8, len(raw))
        elif kind == "extend":
            raw += draw(st.binary(min_size=1, max_size=16))
            struct.pack_into("<i", raw, 8, len(raw))
        else:
            raw[29] = draw(st.integers(0, 255))
    if draw(st.integers(0, 9)):
        reseal(raw)
    return bytes(raw)


@given(broken_compressed())
def test_a_broken_compressed_batch_is_refused_typed_or_reads_the_same_everywhere(raw: bytes) -> None:
    try:
        header = b.validate_batch(raw, 0, LIMIT, require_dense=True, headers=b.DEFAULT_HEADER_LIMITS)
    except TYPED:
        for verify in (True, False):  # the readers refuse it typed too (a consumer with check_crcs off)
            with contextlib.suppress(*TYPED):
                b.decode_records(raw, "t", 0, verify_crc=verify)
            with contextlib.suppress(*TYPED):
                b.batch_views(raw, verify_crc=verify)
        return
    records = b.decode_records(raw, "t", 0)
    assert len(records) == header.record_count
    (view,) = b.batch_views(raw)
    assert [view.record("t", 0, i) for i in range(len(view))] == records


def _with_section(codec: int, section: bytes, declared: int, records: int = 1) -> bytes:
    """A batch of ``records`` records, no tags, whose compressed section is ``declared`` and ``section``
    (a frame made by hand), CRC sealed."""
    raw = bytearray(b.encode_records([(b"v", None, None, None, 1)] * records))
    del raw[_NO_TAGS_SECTION:]
    raw += struct.pack("<I", declared) + section
    raw[29] = codec
    struct.pack_into("<i", raw, 8, len(raw))
    reseal(raw)
    return bytes(raw)


def _frames(data: bytes) -> dict[int, bytes]:
    """Each codec's frame of ``data``, as the producer makes it (without the u32 inflated length)."""
    return {codec: cz.compress(codec, data)[4:] for codec in CODECS}


@pytest.mark.parametrize("codec", CODECS, ids=[cz.NAMES[c] for c in CODECS])
def test_a_frame_inflating_to_more_or_less_than_declared_is_corrupt(codec: int) -> None:
    good = b.encode_records([(b"v", None, None, None, 1)])
    plain_section = good[_NO_TAGS_SECTION:]
    frame = _frames(plain_section + b"extra")[codec]
    with pytest.raises(CorruptBatch):
        b.validate_batch(_with_section(codec, frame, len(plain_section)), 0, LIMIT)
    short = _frames(plain_section[:-1])[codec]
    with pytest.raises(CorruptBatch):
        b.validate_batch(_with_section(codec, short, len(plain_section)), 0, LIMIT)
    with pytest.raises(CorruptBatch, match=r"corrupt|declares|inflates"):
        b.decode_records(_with_section(codec, b"\x00garbage" * 4, len(plain_section)), "t", 0)
    # The same section, declared right, is a good batch: the checks above are about the lie only.
    assert b.decode_records(_with_section(codec, _frames(plain_section)[codec], len(plain_section)), "t", 0)


def test_unknown_codec_bits_are_unsupported_compression_before_anything_is_read() -> None:
    raw = bytearray(b.encode_records([(b"v", None, None, None, 1)]))
    for attributes in (4, 7, 0x08, 0x80):
        raw[29] = attributes
        reseal(raw)
        with pytest.raises(UnsupportedCompression, match=f"unsupported attributes {attributes}"):
            b.validate_batch(bytes(raw), 0, LIMIT)
        with pytest.raises(UnsupportedCompression):
            b.decode_records(bytes(raw), "t", 0)


def test_a_declared_size_over_the_limits_is_refused_before_inflating() -> None:
    section = _frames(bytes(64))[cz.ZSTD]
    # Over the broker's batch limit: BATCH_TOO_LARGE, as an uncompressed batch of that size would be.
    with pytest.raises(BatchTooLarge, match="inflates to"):
        b.validate_batch(_with_section(cz.ZSTD, section, 2 * LIMIT), 0, LIMIT)
    # Over the hard limit anywhere (a consumer): CORRUPT_BATCH, nothing allocated.
    with pytest.raises(CorruptBatch, match="over the limit"):
        b.decode_records(_with_section(cz.ZSTD, section, cz.MAX_INFLATED_BYTES + 1), "t", 0)
    # Fewer bytes than the record count's columns need: refused without inflating either.
    with pytest.raises(CorruptBatch, match="too few"):
        b.decode_records(_with_section(cz.ZSTD, section, 10, records=100), "t", 0)


_BOMB_SCRIPT = """
import resource, sys
from sluice.codec import batch as b
from sluice.errors import CorruptBatch
raw = open(sys.argv[1], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    b.decode_records(raw, "t", 0)
    print("ACCEPTED")
except CorruptBatch as exc:
    print("REFUSED", exc)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def _streamed_bomb(codec: int, inflated: int) -> bytes:
    """A frame of ``inflated`` zero bytes, made in 1 MiB steps (the test never holds the inflated bytes)."""
    chunk = bytes(1 << 20)
    if codec == cz.GZIP:
        c = zlib.compressobj(1, zlib.DEFLATED, 31)
        return b"".join([c.compress(chunk) for _ in range(inflated >> 20)] + [c.flush()])
    if codec == cz.ZSTD:  # no content size in the frame: the reader only has the batch's declared size
        z = zstandard.ZstdCompressor(level=1, write_content_size=False).compressobj()
        return b"".join([z.compress(chunk) for _ in range(inflated >> 20)] + [z.flush()])
    return cz.compress(codec, bytes(inflated))[4:]  # lz4's block API has no streaming


@pytest.mark.parametrize("codec", CODECS, ids=[cz.NAMES[c] for c in CODECS])
def test_a_decompression_bomb_costs_no_more_memory_than_its_declared_size(codec: int, tmp_path: Path) -> None:
    """A frame of 512 MiB of zeros (256 MiB for lz4 and gzip, slower to make) declaring 1 MiB: refused,
    and the reading process's peak memory grows by about the declared size, not the bomb's (measured in
    a fresh process, ru_maxrss)."""
    inflated = (512 if codec == cz.ZSTD else 256) << 20
    path = tmp_path / "bomb"
    path.write_bytes(_with_section(codec, _streamed_bomb(codec, inflated), 1 << 20, records=2))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", _BOMB_SCRIPT, str(path)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    verdict, grown_kb = out.stdout.strip().splitlines()
    assert verdict.startswith("REFUSED"), verdict
    assert int(grown_kb) < 32 * 1024, f"peak memory grew by {int(grown_kb) // 1024} MB"


def test_the_producer_setting_names_the_codec_and_the_missing_library(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert ProducerConfig().compression == "none"
    assert ProducerConfig(compression="zstd").compression == "zstd"
    with pytest.raises(InvalidArgument, match="unknown compression 'snappy'"):
        ProducerConfig(compression="snappy")
    # An lz4 batch made by hand (this install may have no lz4 to make one): a consumer meets it.
    raw = bytearray(b.encode_records([(b"v", None, None, None, 1)]))
    raw[29] = cz.LZ4
    reseal(raw)
    # lz4 is an extra: an SDK-only install without it is told which one (the import fails as it would).
    monkeypatch.setitem(sys.modules, "lz4.block", None)
    with pytest.raises(UnsupportedCompression, match=r"pip install 'sluice\[lz4\]'"):
        ProducerConfig(compression="lz4")
    with pytest.raises(UnsupportedCompression, match=r"pip install 'sluice\[lz4\]'"):  # and a consumer
        b.decode_records(bytes(raw), "t", 0)
    gzipped = stamped(b.encode_records([(b"v", None, None, None, 1)], codec=cz.GZIP))
    assert b.decode_records(gzipped, "t", 0)[0].value == b"v"  # the standard library's gzip needs nothing
