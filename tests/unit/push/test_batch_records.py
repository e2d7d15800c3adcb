"""Keys and values of a forwarded batch sliced all at once on the first read (``BatchRecords``):
each message reads exactly what ``BatchView`` reads for its record (a missing key None, an empty one
b"", values of every length), across batches, cuts and repeated reads."""

from __future__ import annotations

from sluice.client.push.message import BatchRecords, messages_of
from sluice.codec.batch import BatchBuilder, BatchView, stamp
from sluice.v1 import dispatcher_pb2 as pb


def _batch(base: int, rows: list[tuple[bytes, bytes | None]]) -> bytes:
    b = BatchBuilder()
    for i, (value, key) in enumerate(rows):
        b.append(value, key, "t" if i % 3 == 0 else None, {"i": b"%d" % i} if i % 2 else None, 1_000 + i)
    raw = bytearray(b.build())
    stamp(raw, 0, base, 1, 4)
    return bytes(raw)


ROWS: list[tuple[bytes, bytes | None]] = [
    (b"v0", b"k0"),
    (b"", None),  # no key, empty value
    (b"v2" * 50, b""),  # an empty key is not a missing one
    (b"v3", b"key-three"),
    (b"v4", None),
]


def test_every_message_reads_its_own_key_and_value() -> None:
    full = _batch(100, ROWS)
    cut = BatchView(full).cut([(1, 3), (4, 5)])
    plain = _batch(200, [(b"x%d" % i, b"y%d" % i) for i in range(7)])  # every key present
    batch = pb.MessageBatch(topic="t")
    batch.batches.add(partition=1, records=full + plain)
    batch.batches.add(partition=2, records=cut)
    msgs = messages_of(batch, "t", object())
    views = [BatchView(full), BatchView(plain), BatchView(cut)]
    expected = [
        (v.offsets[i], v.key(i), v.value(i), v.tag(i), v.headers(i), v.timestamp(i))
        for v in views
        for i in range(len(v))
    ]
    assert len(msgs) == len(expected) == 5 + 7 + 3
    for _ in range(2):  # the first read slices the batch, the second reads the lists
        got = [(m.offset, m.key, m.value, m.tag, m.headers, m.timestamp) for m in msgs]
        assert got == expected
    assert [m.key for m in msgs[:5]] == [b"k0", None, b"", b"key-three", None]
    assert msgs[12].key is None
    assert msgs[13].key == b""


def test_one_slicing_per_batch() -> None:
    records = BatchRecords(BatchView(_batch(0, ROWS)))
    batch = pb.MessageBatch(topic="t")
    batch.batches.add(partition=0, records=_batch(0, ROWS))
    msgs = messages_of(batch, "t", object())
    shared = {id(m._records) for m in msgs}
    assert len(shared) == 1, "the messages of one batch share its records"
    shared_records = msgs[0]._records
    assert shared_records is not None
    assert shared_records.values is None, "nothing sliced before a read"
    assert msgs[3].value == b"v3"
    values = shared_records.values
    assert values is not None
    assert values[3] == b"v3"
    assert msgs[4].value == b"v4"
    assert shared_records.values is values, "sliced once"
    assert records.load_keys() == [b"k0", None, b"", b"key-three", None]
