"""A topic whose partitions are routed to two dispatchers: one stream each, merged.

Its own cluster with dispatchers d1 and d2 (the coordinator routes partitions by
rendezvous hashing, so a topic with enough partitions lands on both).
"""

from __future__ import annotations

import threading
import time
import uuid
import zlib
from collections.abc import Iterator

import pytest

from sluice import Client
from sluice.client.push import Message, PushConsumer
from tests.integration.push.conftest import PushCluster, run_push_cluster
from tests.integration.push.helpers import drain, nothing_more, produce


@pytest.fixture(scope="module")
def two() -> Iterator[PushCluster]:
    with run_push_cluster(dispatchers=2) as c:
        yield c


def split_topic(client: Client) -> str:
    """A 4-partition topic with partitions on both dispatchers."""
    for _ in range(20):
        name = f"multi-{uuid.uuid4().hex[:8]}"
        client.admin.create_topic(name, partitions=4)
        owners = {p.dispatcher_id for p in client.metadata([name], refresh=True).topic(name).partitions}
        if owners == {"d1", "d2"}:
            return name
    raise AssertionError("no topic split over both dispatchers")


def test_one_stream_per_dispatcher_merged_into_one_queue(two: PushCluster) -> None:
    with Client(two.bootstrap) as client:
        topic = split_topic(client)
        produce(client, topic, 200, key=lambda i: b"k%d" % i)
        with client.push_consumer(
            topic, "m", "shared", initial_position="earliest", receiver_queue_size=100
        ) as pc:
            streams = pc.stats().streams
            assert sorted(s.dispatcher_id for s in streams) == ["d1", "d2"]
            assert sorted(p for s in streams for p in s.partitions) == [0, 1, 2, 3]
            # The queue is split across the streams: 50 permits each.
            assert sorted(s.share for s in pc.stats().flow.streams.values()) == [50, 50]
            got = drain(pc, 200)
            assert sorted(int(m.value) for m in got) == list(range(200))
            assert {m.partition for m in got} == {0, 1, 2, 3}
            assert nothing_more(pc, 0.3)
        subs = client.list_subscriptions(topic)
        assert [(s.subscription, s.type, sorted(s.dispatchers)) for s in subs] == [
            ("m", "shared", ["d1", "d2"])
        ]


def test_zero_queue_across_two_dispatchers(two: PushCluster) -> None:
    with Client(two.bootstrap) as client:
        topic = split_topic(client)
        n = 120
        # Skewed on purpose: every record on the partitions of d1, so whenever the one
        # permit rotates to d2 it must be moved off that idle dispatcher (a handoff).
        parts = client.metadata([topic]).topic(topic).partitions
        d1 = {p.partition for p in parts if p.dispatcher_id == "d1"}
        keys = [k for k in (b"k%d" % i for i in range(1000)) if zlib.crc32(k) % 4 in d1]
        produce(client, topic, n, key=lambda i: keys[i % len(keys)])
        consumers = [
            client.push_consumer(
                topic, "zq", "shared", consumer_name=name, initial_position="earliest", receiver_queue_size=0
            )
            for name in ("a", "b")
        ]
        got: dict[str, list[Message]] = {"a": [], "b": []}
        bad: list[str] = []

        def run(name: str, pc: PushConsumer) -> None:
            deadline = time.monotonic() + 40
            while len(got["a"]) + len(got["b"]) < n and time.monotonic() < deadline:
                try:
                    msg = pc.receive(timeout=0.5)
                except TimeoutError:
                    continue
                st = pc.stats().flow
                if st.queued + st.outstanding > 0 or st.max_outstanding > 1 or st.max_queued > 1:
                    bad.append(f"{name}: {st}")
                got[name].append(msg)
                pc.ack(msg)

        threads = [
            threading.Thread(target=run, args=(nm, pc)) for nm, pc in zip("ab", consumers, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not bad, bad[:3]
        assert sorted(int(m.value) for ms in got.values() for m in ms) == list(range(n))
        handoffs = 0
        for pc in consumers:
            assert len(pc.stats().streams) == 2
            handoffs += pc.stats().handoffs
            pc.close()
        assert handoffs > 0
