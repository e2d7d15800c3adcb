"""The SDK reads records out of the log batches the dispatcher forwards (``Subscribe.record_batches``).

Every field must survive: the dispatcher cuts batches down to each consumer's records (filters,
Key_Shared, redeliveries pick records out of the middle of a batch) and the SDK decodes them lazily.
"""

from __future__ import annotations

from typing import Any

from sluice import Client
from sluice.client.push import Message
from tests.integration.push.conftest import PushCluster
from tests.integration.push.helpers import drain, eventually, nothing_more

Sent = tuple[bytes | None, str | None, dict[str, bytes], int]  # key, tag, headers, timestamp


def fields(m: Message) -> tuple[bytes, Sent]:
    return m.value, (m.key, m.tag, m.headers, m.timestamp)


def test_key_shared_filtered_records_keep_every_field_and_redelivery_counts(
    cluster: PushCluster, client: Client, topic: str
) -> None:
    n = 90
    sent: dict[bytes, Sent] = {}
    with client.producer(topic, linger="20ms") as producer:  # a few large batches with mixed tags
        for i in range(n):
            key = f"k{i % 5}".encode() if i % 11 else None
            tag = ("a", "b", None)[i % 3]
            headers = {"n": str(i).encode()} if i % 2 else {}
            value = str(i).encode()
            producer.send(value, key=key, tag=tag, headers=headers, timestamp=1_000 + i)
            sent[value] = (key, tag, headers, 1_000 + i)
        producer.flush()
    wanted = {v: s for v, s in sent.items() if s[1] == "a"}
    opts: dict[str, Any] = {"initial_position": "earliest", "filter": "a", "nack_delay": "50ms"}
    with (
        client.push_consumer(topic, "rb", "key_shared", consumer_name="x", **opts) as x,
        client.push_consumer(topic, "rb", "key_shared", consumer_name="y", **opts) as y,
    ):
        got: dict[bytes, Sent] = {}
        nacked: bytes | None = None
        counts: dict[bytes, list[int]] = {}
        while len(got) < len(wanted):
            for pc in (x, y):
                try:
                    msg = pc.receive(timeout=0.2)
                except TimeoutError:
                    continue
                value, rest = fields(msg)
                assert rest == wanted[value], f"record {value!r} changed on the way"
                counts.setdefault(value, []).append(msg.redelivery_count)
                if nacked is None:
                    nacked = value
                    pc.nack(msg)
                    continue
                got[value] = rest
                pc.ack(msg)
        assert got == wanted
        assert nacked is not None
        assert counts[nacked] == [0, 1], "the nacked record came back once, counted"
        assert all(c == [0] for v, c in counts.items() if v != nacked)
        assert nothing_more(x, 0.3)
        assert nothing_more(y, 0.1)
        eventually(
            lambda: all(c.unacked == 0 for c in cluster.describe(client, topic, "rb").consumers),
            what="acks (sent as ranges) to reach the dispatcher",
        )


def test_redelivered_record_batch_carries_the_count(client: Client, topic: str) -> None:
    with client.producer(topic, linger="5ms") as producer:
        for i in range(10):
            producer.send(str(i).encode(), key=b"k", headers={"i": str(i).encode()})
        producer.flush()
    with client.push_consumer(topic, "rc", "shared", initial_position="earliest", nack_delay="50ms") as pc:
        first = drain(pc, 10, ack=False)
        for m in first[3:6]:
            pc.nack(m)
        for m in first[:3] + first[6:]:
            pc.ack(m)
        again = drain(pc, 3)
        assert [m.value for m in again] == [b"3", b"4", b"5"]
        assert [m.redelivery_count for m in again] == [1, 1, 1]
        assert [m.headers for m in again] == [{"i": b"3"}, {"i": b"4"}, {"i": b"5"}]
        assert all(m.key == b"k" for m in again)
        assert nothing_more(pc, 0.3)
