"""Incremental fetch sessions against a real broker (KIP-227 semantics)."""

from __future__ import annotations

import time

from sluice.v1 import broker_pb2 as pb
from sluice.v1 import common_pb2

from .conftest import Broker, make_batch, part, vals


def test_incremental_session(broker: Broker, topic: str) -> None:
    broker.assign(topic, partitions=3)
    broker.produce(topic, 0, make_batch(vals(3)))
    # Open: a full fetch, every partition in the answer.
    resp = broker.fetch(part(topic, 0, 0), part(topic, 0, 1), part(topic, 0, 2), epoch=0)
    sid = resp.session_id
    assert sid != 0
    assert resp.error.code == common_pb2.NONE
    assert [(p.partition, p.next_offset) for p in resp.partitions] == [(0, 3), (1, 0), (2, 0)]

    # Incremental: only the changed partition (its new position) is sent; nothing new: empty.
    resp = broker.fetch(part(topic, 3, 0), session_id=sid, epoch=1)
    assert resp.session_id == sid
    assert list(resp.partitions) == []

    # New data on partition 1 only: the answer names partition 1 only.
    broker.produce(topic, 1, make_batch(vals(2)))
    resp = broker.fetch(session_id=sid, epoch=2)
    assert [(p.partition, p.high_watermark, p.next_offset) for p in resp.partitions] == [(1, 2, 2)]

    # A parked incremental fetch wakes for any session partition.
    fut = broker.stub.Fetch.future(
        pb.FetchRequest(
            max_wait_ms=5000,
            min_bytes=1,
            session_id=sid,
            session_epoch=3,
            partitions=[part(topic, 2, 1)],
        ),
        timeout=10,
    )
    time.sleep(0.2)
    assert not fut.done()
    broker.produce(topic, 2, make_batch(vals(1)))
    resp = fut.result()
    assert [p.partition for p in resp.partitions] == [2]

    # Epoch errors are request-level and typed; the session survives them.
    resp = broker.fetch(session_id=sid, epoch=9)
    assert resp.error.code == common_pb2.INVALID_FETCH_SESSION_EPOCH
    assert list(resp.partitions) == []
    resp = broker.fetch(session_id=12345, epoch=1)
    assert resp.error.code == common_pb2.FETCH_SESSION_NOT_FOUND

    # Forgotten partitions are no longer fetched.
    resp = broker.fetch(part(topic, 1, 2), session_id=sid, epoch=4, forgotten=[(topic, 0)])
    assert list(resp.partitions) == []
    broker.produce(topic, 0, make_batch(vals(1)))
    started = time.monotonic()
    resp = broker.fetch(session_id=sid, epoch=5, max_wait_ms=300)
    assert list(resp.partitions) == []
    assert time.monotonic() - started >= 0.28

    # Closing with epoch -1 ends the session.
    resp = broker.fetch(part(topic, 0, 0), session_id=sid, epoch=-1)
    assert resp.session_id == 0
    assert broker.fetch(session_id=sid, epoch=6).error.code == common_pb2.FETCH_SESSION_NOT_FOUND
