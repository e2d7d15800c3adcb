"""An SQL92 filter on a push subscription (the dispatcher): only matching records are delivered, and
the filtered-out ones are acknowledged for it, so the cursor moves past them (real processes)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from sluice import Client
from sluice.codec.filter import sql_expression
from sluice.errors import InvalidFilter
from tests.integration.push.conftest import PushCluster, run_push_cluster


@pytest.fixture(scope="module")
def push_cluster() -> Iterator[PushCluster]:
    with run_push_cluster() as c:
        yield c


def test_push_subscription_delivers_only_matching_records(push_cluster: PushCluster) -> None:
    with Client(push_cluster.bootstrap, request_timeout=10) as client:
        topic = f"sqlpush-{uuid.uuid4().hex[:8]}"
        client.admin.create_topic(topic, partitions=2)
        with client.producer(topic, partitioner="round_robin") as p:
            for i in range(200):
                headers = {"kind": b"order" if i % 4 == 0 else b"click", "amount": str(i).encode()}
                p.send(str(i).encode(), headers=headers)
        want = sorted(i for i in range(200) if i % 4 == 0 and i >= 100)
        expr = sql_expression("kind = 'order' AND amount >= 100")
        got: list[int] = []
        with client.push_consumer(topic, "orders", "shared", initial_position="earliest", filter=expr) as pc:
            assert push_cluster.describe(client, topic, "orders").summary.filter == expr
            deadline = time.monotonic() + 30
            while len(got) < len(want):
                assert time.monotonic() < deadline, len(got)
                try:
                    msg = pc.receive(timeout=1.0)
                except TimeoutError:
                    continue
                got.append(int(msg.value))
                pc.ack(msg)
            with pytest.raises(TimeoutError):  # nothing else comes
                pc.receive(timeout=0.5)
        assert sorted(got) == want
        # The subscription's cursor passed the filtered-out records: nothing is left unacknowledged.
        deadline = time.monotonic() + 10
        while True:
            backlog = push_cluster.describe(client, topic, "orders").summary.backlog
            if backlog == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert backlog == 0
        with pytest.raises(InvalidFilter, match="column"):
            client.push_consumer(topic, "bad", "shared", filter=sql_expression("amount > 'x'"))
