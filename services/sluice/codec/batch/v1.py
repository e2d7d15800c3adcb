"""Format version 1, read only to convert it: what brokers and SDKs wrote before replication.

Version 1 had a 54-byte header (no leader epoch, no producer fields) and its CRC at byte 20,
covering [24, length). The tag table, columns and data that follow the header are the same in
both versions, so a conversion copies them as they are and computes a new CRC over the new
header fields and the same body. Caller: the broker's data-directory upgrade
(``sluice.broker.log.upgrade``).
"""

from __future__ import annotations

import struct

from sluice.codec.batch.layout import MAGIC_AT, assemble, crc32c
from sluice.errors import CorruptBatch

V1_MAGIC = 1
#: base_offset, batch_length, append_time_ms, crc, magic, attributes, record_count,
#: last_offset_delta, base_timestamp, max_timestamp, tag_table_length.
V1_HEADER = struct.Struct("<qiqIBBiiqqI")
V1_HEADER_SIZE = V1_HEADER.size  # 54
V1_CRC_START = 24


def is_v1(buf: bytes | bytearray | memoryview, pos: int = 0) -> bool:
    """Whether the batch at ``pos`` says it is version 1 (its magic; nothing else is checked)."""
    return len(buf) - pos > MAGIC_AT and buf[pos + MAGIC_AT] == V1_MAGIC


def v1_length(buf: bytes | bytearray | memoryview, pos: int) -> int | None:
    """The length of the whole, CRC-valid version-1 batch at ``pos``; None if it is not one
    (short, torn, another magic or a CRC mismatch: where a converter stops)."""
    if len(buf) - pos < V1_HEADER_SIZE:
        return None
    _, length, _, crc, magic, *_ = V1_HEADER.unpack_from(buf, pos)
    if magic != V1_MAGIC or length < V1_HEADER_SIZE + 2 or pos + length > len(buf):
        return None
    if crc32c(memoryview(buf)[pos + V1_CRC_START : pos + length]) != crc:
        return None
    return int(length)


def upgrade_v1(buf: bytes | bytearray | memoryview, pos: int, leader_epoch: int = 0) -> bytes:
    """The version-2 form of the version-1 batch at ``pos``: same records, base offset and
    append time, the given leader epoch, producer fields -1, and a new CRC.

    Raises CorruptBatch if the batch is not a whole, CRC-valid version-1 batch: a conversion
    never launders a corrupt batch into one with a fresh, valid CRC.
    """
    length = v1_length(buf, pos)
    if length is None:
        raise CorruptBatch(f"no whole, CRC-valid format-1 batch at byte {pos}")
    base, _, append_time, _, _, attributes, count, last_delta, base_ts, max_ts, tags = V1_HEADER.unpack_from(
        buf, pos
    )
    if attributes != 0:
        raise CorruptBatch(f"unsupported batch attributes {attributes}")
    body = bytes(buf[pos + V1_HEADER_SIZE : pos + length])
    return assemble(count, last_delta, base_ts, max_ts, tags, body, base, append_time, leader_epoch)
