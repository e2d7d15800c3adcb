"""Per-batch compression: the codec in the attribute bits, the records section compressed.

A compressed batch (``attributes & CODEC_MASK`` != 0, docs/compression.md)::

    header            72 bytes, as in every batch (record count, offsets, timestamps: readable)
    tag table         tag_table_length bytes, readable (tag filters and the SQL header summary prune on it)
    inflated_length   u32: the bytes of the columns and data once decompressed
    frame             the codec's frame of the columns and data, to the end of the batch

The CRC covers the stored (compressed) bytes, so a follower copies and checks them as they are. Readers
turn a compressed batch into the plain batch it stands for (``plain_batch``: attributes 0, the CRC
recomputed) and read that with the ordinary code: one decoder for both forms.

Inflation is bounded twice before a byte is allocated: the declared ``inflated_length`` must be at most
``limit`` (``MAX_INFLATED_BYTES``, or the broker's ``max_batch_bytes`` on produce), and each codec is
asked for exactly that many bytes, so a frame that would produce more is refused, never inflated.
"""

from __future__ import annotations

import importlib
import struct
import threading
import zlib
from collections.abc import Callable
from typing import Any

from sluice.codec.batch.layout import (
    COLUMN_BYTES,
    CRC_AT,
    CRC_START,
    HEADER_SIZE,
    BatchHeader,
    read_header,
)
from sluice.codec.batch.layout import crc32c_ext as _crc32c
from sluice.errors import CorruptBatch, InvalidArgument, SluiceError, UnsupportedCompression

#: Codec ids in the low three bits of ``attributes``; the other five bits are reserved (must be 0).
NONE, GZIP, LZ4, ZSTD = 0, 1, 2, 3
CODEC_MASK = 0x07
CODECS: dict[str, int] = {"none": NONE, "gzip": GZIP, "lz4": LZ4, "zstd": ZSTD}
NAMES: dict[int, str] = {v: k for k, v in CODECS.items()}
#: How to install a codec's library (gzip is the standard library's zlib). zstandard is a dependency of
#: the SDK itself, so every install reads the recommended codec; lz4 is the ``lz4`` extra.
INSTALL: dict[int, str] = {LZ4: "pip install 'sluice[lz4]'", ZSTD: "pip install zstandard"}
_MODULES: dict[int, str] = {LZ4: "lz4.block", ZSTD: "zstandard"}
#: The most bytes one batch may inflate to anywhere: the 64 MiB gRPC message limit, the largest an
#: uncompressed batch can be, so compression never lets a batch grow past what a plain one could be.
MAX_INFLATED_BYTES = 64 * 1024 * 1024
#: Levels (bench/compression.py): zstd 1, measured on JSON order events twice as fast as zstd's default 3
#: and no larger; gzip 6, zlib's default; lz4's block mode has no level.
ZSTD_LEVEL = 1
GZIP_LEVEL = 6
_SIZE = struct.Struct("<I")
_LENGTH_AT = 8
_ATTRIBUTES_AT = 29

_local = threading.local()


def _library(codec: int) -> Any:
    name = _MODULES[codec]
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise UnsupportedCompression(
            f"{NAMES[codec]} compression needs the {name.split('.')[0]} library: {INSTALL[codec]}"
        ) from exc


def codec_id(name: str) -> int:
    """The codec id of a producer's ``compression`` setting, its library checked (UnsupportedCompression
    naming the extra when it is missing; InvalidArgument for an unknown name)."""
    codec = CODECS.get(name)
    if codec is None:
        raise InvalidArgument(f"unknown compression {name!r}: choose one of {', '.join(CODECS)}")
    if codec in _MODULES:
        _library(codec)
    return codec


def _zstd_compressor() -> Any:
    # One per thread: a ZstdCompressor must not be used by two threads at once.
    c = getattr(_local, "zstd", None)
    if c is None:
        c = _local.zstd = _library(ZSTD).ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
    return c


def compress(codec: int, section: bytes) -> bytes:
    """``inflated_length`` and the codec's frame of ``section`` (a batch's columns and data)."""
    frame: bytes
    if codec == ZSTD:
        frame = _zstd_compressor().compress(section)
    elif codec == LZ4:
        frame = _library(LZ4).compress(section, store_size=False)
    elif codec == GZIP:
        c = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # 31: the gzip wrapper (RFC 1952)
        frame = c.compress(section) + c.flush()
    else:
        raise UnsupportedCompression(f"unknown codec id {codec}")
    return _SIZE.pack(len(section)) + frame


def _inflate_zstd(frame: memoryview, size: int) -> bytes:
    zstd = _library(ZSTD)
    # zstandard sizes its output from the frame's own content size and ignores max_output_size when the
    # frame has one: that size must be the declared one (already bounded), or nothing is allocated.
    declared = zstd.frame_content_size(frame)
    if declared != size:
        raise CorruptBatch(f"zstd frame declares {declared} bytes, the batch {size}")
    d = getattr(_local, "unzstd", None)
    if d is None:
        d = _local.unzstd = zstd.ZstdDecompressor()
    return bytes(d.decompress(frame, max_output_size=size))


def _inflate_lz4(frame: memoryview, size: int) -> bytes:
    # The block API writes into a buffer of exactly ``size`` bytes and fails on more.
    return bytes(_library(LZ4).decompress(frame, uncompressed_size=size))


def _inflate_gzip(frame: memoryview, size: int) -> bytes:
    d = zlib.decompressobj(31)
    out = d.decompress(frame, size)  # at most ``size`` bytes
    if d.unconsumed_tail or not d.eof:
        raise CorruptBatch(f"gzip payload inflates beyond its declared {size} bytes")
    if d.unused_data:
        raise CorruptBatch("gzip payload has trailing bytes")
    return out


_INFLATERS: dict[int, Callable[[memoryview, int], bytes]] = {
    ZSTD: _inflate_zstd,
    LZ4: _inflate_lz4,
    GZIP: _inflate_gzip,
}


def check_codec(h: BatchHeader) -> int:
    """The codec of a batch's attributes; UnsupportedCompression for bits that name none."""
    codec = h.attributes & CODEC_MASK
    if h.attributes & ~CODEC_MASK or codec not in NAMES:
        raise UnsupportedCompression(
            f"batch at offset {h.base_offset}: unsupported attributes {h.attributes}"
        )
    return codec


def inflated_size(buf: bytes | bytearray | memoryview, pos: int, h: BatchHeader) -> int:
    """The plain length the compressed batch at ``pos`` declares (its header, tag table and inflated
    section), read without inflating; CorruptBatch when the field does not fit."""
    at = pos + HEADER_SIZE + h.tag_table_length
    if h.tag_table_length < 2 or at + _SIZE.size > min(pos + h.length, len(buf)):
        raise CorruptBatch(f"compressed batch at offset {h.base_offset} is truncated")
    (size,) = _SIZE.unpack_from(buf, at)
    return HEADER_SIZE + h.tag_table_length + int(size)


def inflate(
    buf: bytes | bytearray | memoryview, pos: int, h: BatchHeader, limit: int = MAX_INFLATED_BYTES
) -> tuple[bytes, BatchHeader]:
    """The plain batch the compressed batch at ``pos`` stands for, and its header.

    Same header fields but ``attributes`` 0, the new length and a CRC of the plain bytes (so the readers'
    own CRC check and the dispatcher's byte-for-byte forwarding work on it unchanged). Bad input is a
    typed error and allocates nothing beyond ``limit``: unknown codec bits or a missing library
    (UnsupportedCompression), a declared size over ``limit`` or under what the record count needs, a
    corrupt frame, a frame inflating to more or less than declared (CorruptBatch).
    """
    codec = check_codec(h)
    if codec in _MODULES:
        _library(codec)  # first: a reader without the library is told which to install, whatever the bytes
    at = pos + HEADER_SIZE + h.tag_table_length
    end = pos + h.length
    if end > len(buf):
        raise CorruptBatch(f"compressed batch at offset {h.base_offset} is truncated")
    size = inflated_size(buf, pos, h) - (at - pos)
    mv = memoryview(buf)
    if size > limit:
        raise CorruptBatch(
            f"compressed batch at offset {h.base_offset} declares {size} inflated bytes, over the limit of "
            f"{limit}"
        )
    if size < COLUMN_BYTES * max(h.record_count, 0):
        raise CorruptBatch(f"compressed batch at offset {h.base_offset} declares too few inflated bytes")
    try:
        section = _INFLATERS[codec](mv[at + _SIZE.size : end], size)
    except SluiceError:  # ours: a size mismatch (CorruptBatch), a missing library (UnsupportedCompression)
        raise
    except Exception as exc:  # each library's own error type (ZstdError, LZ4BlockError, zlib.error)
        raise CorruptBatch(
            f"{NAMES[codec]} payload of batch at offset {h.base_offset} is corrupt: {exc}"
        ) from exc
    if len(section) != size:
        raise CorruptBatch(
            f"{NAMES[codec]} payload of batch at offset {h.base_offset} inflates to {len(section)} bytes, "
            f"not its declared {size}"
        )
    head = bytearray(mv[pos : pos + HEADER_SIZE])
    _SIZE.pack_into(head, _LENGTH_AT, HEADER_SIZE + h.tag_table_length + size)
    head[_ATTRIBUTES_AT] = 0
    tags = mv[pos + HEADER_SIZE : at]
    # The CRC in three steps, so the inflated section is copied once, into the result.
    crc = int(_crc32c.crc32c(section, _crc32c.crc32c(tags, _crc32c.crc32c(memoryview(head)[CRC_START:]))))
    _SIZE.pack_into(head, CRC_AT, crc)
    out = b"".join((head, tags, section))
    return out, read_header(out, 0)


def plain_batch(
    buf: bytes, pos: int, h: BatchHeader, limit: int = MAX_INFLATED_BYTES
) -> tuple[bytes, int, BatchHeader]:
    """``(buf, pos, h)`` of the batch at ``pos`` in its plain form: itself when it is not compressed,
    else its inflated copy at position 0 (``inflate``)."""
    if not h.attributes:
        return buf, pos, h
    out, header = inflate(buf, pos, h, limit)
    return out, 0, header


def is_available(codec: int) -> bool:
    """Whether this process can compress and inflate ``codec`` (tests, the benchmark)."""
    if codec not in _MODULES:
        return codec in NAMES
    try:
        _library(codec)
    except UnsupportedCompression:
        return False
    return True


__all__ = [
    "CODECS",
    "CODEC_MASK",
    "GZIP",
    "LZ4",
    "MAX_INFLATED_BYTES",
    "NAMES",
    "NONE",
    "ZSTD",
    "check_codec",
    "codec_id",
    "compress",
    "inflate",
    "inflated_size",
    "is_available",
    "plain_batch",
]
