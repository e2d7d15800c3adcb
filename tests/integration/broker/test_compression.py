"""Compressed batches on a real broker (docs/compression.md): stored and served byte for byte as
produced, found by offset and by time, filtered server-side (tag and SQL) with pruning by the readable
header; bad compressed input is refused with a typed per-partition error and loses nothing."""

from __future__ import annotations

import struct
import zlib

import pytest

from sluice.codec.batch import CRC_AT, CRC_START, HEADER_SIZE, BatchBuilder, crc32c, read_header
from sluice.codec.batch import compression as cz
from sluice.codec.filter import sql_expression
from sluice.v1 import common_pb2
from tests.integration.broker.conftest import Broker, records

CODECS = [cz.ZSTD, cz.LZ4, cz.GZIP]


def compressed(codec: int, n: int, first: int, ts: int = 1_000) -> bytes:
    b = BatchBuilder(codec)
    for i in range(first, first + n):
        value = b'{"order": %d, "status": "paid", "items": [1, 2, 3]}' % i
        b.append(value, b"k%d" % i, ("a", "b", None)[i % 3], {"region": f"r{i % 4}".encode()}, ts + i)
    return b.build()


@pytest.mark.parametrize("codec", CODECS, ids=[cz.NAMES[c] for c in CODECS])
def test_compressed_batches_are_stored_served_and_filtered(broker: Broker, topic: str, codec: int) -> None:
    broker.assign(topic)
    first, second = compressed(codec, 30, 0), compressed(codec, 30, 30, ts=50_000)
    assert broker.produce(topic, 0, first).base_offset == 0
    assert broker.produce(topic, 0, second).base_offset == 30
    p = broker.fetch_one(topic, 0)
    # Served as stored: the produced bytes, only the leader's stamps (outside the CRC) differ.
    assert len(p.records) == len(first) + len(second)
    assert p.records[CRC_START : len(first)] == first[CRC_START:]
    got = records(p)
    assert [r.offset for r in got] == list(range(60))
    assert got[31].value == b'{"order": 31, "status": "paid", "items": [1, 2, 3]}'
    assert (got[31].key, got[31].tag, got[31].headers) == (b"k31", "b", {"region": b"r3"})
    # By time: the timestamp index reads the compressed batch's records.
    assert broker.offsets(topic, 50_040).offset == 40
    tagged = broker.fetch_one(topic, 0, filter="b")
    assert [r.offset for r in records(tagged)] == [i for i in range(60) if i % 3 == 1]
    assert tagged.next_offset == 60
    sql = broker.fetch_one(topic, 0, filter=sql_expression("region = 'r2'"))
    assert [r.offset for r in records(sql)] == [i for i in range(60) if i % 4 == 2]
    pruned = broker.fetch_one(topic, 0, filter=sql_expression("region = 'elsewhere'"))
    assert (pruned.records, pruned.next_offset) == (b"", 60)


def _sealed(raw: bytearray) -> bytes:
    raw[CRC_AT : CRC_AT + 4] = crc32c(bytes(raw[CRC_START:])).to_bytes(4, "little")
    return bytes(raw)


def test_bad_compressed_batches_are_refused_typed_and_lose_nothing(broker: Broker, topic: str) -> None:
    broker.assign(topic, max_batch_bytes=1 << 20)
    good = compressed(cz.ZSTD, 10, 0)
    assert broker.produce(topic, 0, good).error.code == common_pb2.NONE
    tags_end = HEADER_SIZE + read_header(good).tag_table_length  # the u32 inflated length is here
    unknown = bytearray(good)
    unknown[29] = 0x05
    corrupt = bytearray(good)
    corrupt[tags_end + 8 : tags_end + 16] = b"\xff" * 8
    lying = bytearray(good)  # declares a size its frame does not inflate to
    struct.pack_into("<I", lying, tags_end, struct.unpack_from("<I", good, tags_end)[0] + 1)
    # A gzip frame of 64 MiB of zeros declared as 900 KiB: within the limit, inflation stops there.
    c = zlib.compressobj(1, zlib.DEFLATED, 31)
    bomb_frame = b"".join([c.compress(bytes(1 << 20)) for _ in range(64)] + [c.flush()])
    bomb = bytearray(good[:tags_end]) + struct.pack("<I", 900 << 10) + bomb_frame
    bomb[29] = cz.GZIP
    struct.pack_into("<i", bomb, 8, len(bomb))
    huge = bytearray(bomb)  # declares more than the topic's batch limit
    struct.pack_into("<I", huge, tags_end, 2 << 20)
    cases = {
        "unknown codec bits": (_sealed(unknown), common_pb2.UNSUPPORTED_COMPRESSION),
        "corrupt frame": (_sealed(corrupt), common_pb2.CORRUPT_BATCH),
        "declared size not met": (_sealed(lying), common_pb2.CORRUPT_BATCH),
        "bomb": (_sealed(bomb), common_pb2.CORRUPT_BATCH),
        "declared over the batch limit": (_sealed(huge), common_pb2.BATCH_TOO_LARGE),
    }
    for name, (raw, code) in cases.items():
        error = broker.produce(topic, 0, raw).error
        assert error.code == code, (name, error)
    # Nothing was appended and the broker is fine: the next good batch follows the first.
    assert broker.produce(topic, 0, compressed(cz.LZ4, 5, 10)).base_offset == 10
    assert [r.offset for r in records(broker.fetch_one(topic, 0))] == list(range(15))
    assert broker.alive()
