"""Format-1 batches for tests of the upgrade path: what brokers and SDKs wrote before replication.

Made by taking a format-2 batch apart (the body after the header is the same in both versions)
and framing it with a format-1 header and CRC, exactly as ``BatchBuilder`` framed it then.
"""

from __future__ import annotations

import struct

from sluice.codec.batch import HEADER_SIZE, crc32c, read_header
from sluice.codec.batch.v1 import V1_HEADER_SIZE


def to_v1(batch: bytes, base_offset: int | None = None, append_time_ms: int | None = None) -> bytes:
    """The format-1 form of one format-2 batch (its stamps kept unless given)."""
    h = read_header(batch)
    body = batch[HEADER_SIZE : h.length]
    covered = struct.pack(
        "<BBiiqqI",
        1,
        0,
        h.record_count,
        h.last_offset_delta,
        h.base_timestamp,
        h.max_timestamp,
        h.tag_table_length,
    )
    crc = crc32c(covered + body)
    base = h.base_offset if base_offset is None else base_offset
    when = h.append_time_ms if append_time_ms is None else append_time_ms
    out = struct.pack("<qiqI", base, V1_HEADER_SIZE + len(body), when, crc) + covered + body
    assert len(out) - len(body) == V1_HEADER_SIZE
    return out
