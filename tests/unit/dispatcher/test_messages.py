"""What the dispatcher puts on the wire for a delivery, compared with the protobuf runtime.

- the ``PushedMessage`` path (consumers without ``record_batches``): the hand-written encoding equals the
  protobuf runtime's, byte for byte, and the redelivery count merges in;
- the record-batch path: the cut log batches decode to exactly the delivered records, in delivery order,
  with their redelivery counts, whatever subset of a batch a consumer got.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec.batch import BatchBuilder, Record, batch_views, decode_records, stamp, validate_batch
from sluice.dispatcher.messages import (
    COMPACT_MIN_BATCH_BYTES,
    Message,
    compact,
    encode_batch_event,
    encode_batches_event,
    encode_pushed,
    messages_of,
)
from sluice.v1 import dispatcher_pb2 as pb
from tests.examples import examples


def reference(r: Record, count: int = 0, epoch: int = -1) -> pb.PushedMessage:
    m = pb.PushedMessage(
        id=pb.MessageId(partition=r.partition, offset=r.offset),
        value=r.value,
        timestamp=r.timestamp,
        redelivery_count=count,
    )
    if epoch >= 0:
        m.id.leader_epoch = epoch
    if r.key is not None:
        m.key = r.key
    if r.tag:
        m.tag = r.tag
    m.headers.update(r.headers)
    return m


records = st.builds(
    Record,
    st.just("t"),
    st.integers(0, 10_000),
    st.integers(0, 2**62),
    st.one_of(st.none(), st.binary(max_size=20)),
    st.binary(max_size=300),
    st.one_of(st.none(), st.text("abc.:-", min_size=1, max_size=10)),
    st.dictionaries(st.text("xyz", min_size=1, max_size=5), st.binary(max_size=10), max_size=2),
    st.integers(-(2**40), 2**45),
)


@settings(max_examples=300, deadline=None)
@given(records, st.integers(-1, 2**31 - 1))
def test_hand_encoding_matches_protobuf(r: Record, epoch: int) -> None:
    body = encode_pushed(r, epoch)
    if not r.headers:
        assert body == reference(r, epoch=epoch).SerializeToString()
    decoded = pb.PushedMessage.FromString(body)
    assert decoded == reference(r, epoch=epoch)
    assert decoded.id.HasField("leader_epoch") == (epoch >= 0)


def log_batch(
    partition: int, base: int, rows: list[tuple[bytes | None, bytes, str | None, dict[str, bytes]]]
) -> list[Message]:
    b = BatchBuilder()
    for i, (key, value, tag, headers) in enumerate(rows):
        b.append(value, key, tag, headers or None, 5_000 + i)
    raw = bytearray(b.build())
    stamp(raw, 0, base, 7, 0)
    return messages_of(batch_views(bytes(raw)), partition, base)


rows = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(min_size=1, max_size=8)),
        st.binary(max_size=40),
        st.one_of(st.none(), st.sampled_from(["a", "b", "c"])),
        st.dictionaries(st.sampled_from(["h", "i"]), st.binary(max_size=5), max_size=2),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=examples(80), deadline=None)
@given(rows, rows, st.data())
def test_batches_event_carries_exactly_the_delivered_records(
    rows_a: list[tuple[bytes | None, bytes, str | None, dict[str, bytes]]],
    rows_b: list[tuple[bytes | None, bytes, str | None, dict[str, bytes]]],
    data: st.DataObject,
) -> None:
    msgs = log_batch(3, 100, rows_a) + log_batch(3, 100 + len(rows_a), rows_b) + log_batch(0, 7, rows_a)
    # Any subset, in any order (redeliveries go before new messages, Key_Shared skips around).
    chosen = data.draw(st.lists(st.sampled_from(msgs), unique_by=id, min_size=1))
    counts = data.draw(st.lists(st.integers(0, 5), min_size=len(chosen), max_size=len(chosen)))
    event = pb.DispatcherEvent.FromString(encode_batches_event("topic-1", chosen, counts))
    assert event.messages.topic == "topic-1"
    assert not event.messages.messages
    got: list[tuple[int, Record, int]] = []
    for entry in event.messages.batches:
        validate_batch(entry.records, 0, 1 << 20)
        recs = decode_records(entry.records, "", entry.partition)
        n = list(entry.redelivery_counts) or [0] * len(recs)
        assert len(n) == len(recs)
        got += [(entry.partition, r, c) for r, c in zip(recs, n, strict=True)]
    assert got == [(m.partition, m.record, c) for m, c in zip(chosen, counts, strict=True)]


def test_pushed_path_encodes_records_of_log_batches() -> None:
    msgs = log_batch(2, 40, [(b"k", b"v1", "a", {}), (None, b"v2", None, {"h": b"x"})])
    event = pb.DispatcherEvent.FromString(encode_batch_event("t", [msgs[0].framed(0), msgs[1].framed(3)]))
    got = list(event.messages.messages)
    assert [(m.id.partition, m.id.offset, m.redelivery_count) for m in got] == [(2, 40, 0), (2, 41, 3)]
    # The epoch of their batch (0 here, written: a field with presence), for the consumer's acks.
    assert all(m.id.HasField("leader_epoch") and m.id.leader_epoch == 0 for m in got)
    assert (got[0].key, got[0].tag, got[0].value) == (b"k", "a", b"v1")
    assert (dict(got[1].headers), got[1].timestamp) == ({"h": b"x"}, 5_001)


def test_messages_of_skips_records_below_the_start() -> None:
    msgs = log_batch(0, 10, [(None, b"x", None, {})] * 5)
    views = list({id(m.view): m.view for m in msgs}.values())
    assert [m.offset for m in messages_of(views, 0, 12)] == [12, 13, 14]
    assert messages_of(views, 0, 15) == []


def test_compact_moves_few_held_messages_out_of_a_large_batch() -> None:
    rows: list[tuple[bytes | None, bytes, str | None, dict[str, bytes]]] = [
        (f"k{i}".encode(), bytes([i % 251]) * 100, "a" if i % 2 else None, {}) for i in range(2000)
    ]
    msgs = log_batch(1, 500, rows)
    big = msgs[0].view
    assert big.header.length > COMPACT_MIN_BATCH_BYTES
    held = [msgs[3], msgs[4], msgs[1500]]
    before = [(m.offset, m.record, m.key_hash) for m in held]
    released = compact(held)
    assert released > big.header.length * 0.9
    assert all(m.view is not big for m in held)
    assert held[0].view is held[2].view, "one small batch for the group"
    assert [(m.offset, m.record, m.key_hash) for m in held] == before
    # Delivering them afterwards still carries exactly these records.
    event = pb.DispatcherEvent.FromString(encode_batches_event("t", held, [0, 2, 0]))
    (entry,) = event.messages.batches
    assert [r.offset for r in decode_records(entry.records, "", 1)] == [503, 504, 2000]
    assert list(entry.redelivery_counts) == [0, 2, 0]
    # Many held messages of a batch: it stays as it is.
    assert compact(msgs[:1000]) == 0
    assert msgs[0].view is big
