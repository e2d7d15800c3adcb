"""The hand-written PushedMessage encoding equals the protobuf runtime's, byte for byte."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec.batch import Record
from sluice.dispatcher.messages import encode_batch_event, encode_messages
from sluice.v1 import dispatcher_pb2 as pb


def reference(r: Record, count: int = 0) -> pb.PushedMessage:
    m = pb.PushedMessage(
        id=pb.MessageId(partition=r.partition, offset=r.offset),
        value=r.value,
        timestamp=r.timestamp,
        redelivery_count=count,
    )
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
@given(st.lists(records, min_size=1, max_size=5), st.integers(0, 1000))
def test_hand_encoding_matches_protobuf(recs: list[Record], count: int) -> None:
    msgs = encode_messages(recs)
    for r, m in zip(recs, msgs, strict=True):
        body = m.wire[m._head :]
        if not r.headers:
            assert body == reference(r).SerializeToString()
        assert pb.PushedMessage.FromString(body) == reference(r)
    event = pb.DispatcherEvent.FromString(encode_batch_event("topic-1", [m.framed(count) for m in msgs]))
    assert event.messages.topic == "topic-1"
    assert list(event.messages.messages) == [reference(r, count) for r in recs]
