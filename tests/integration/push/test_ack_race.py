"""Per-message ``ack()`` takes no lock (``client/push/unacked.py``): threads acking the same messages
at once still count and send each ack once, and the dispatcher sees every message acked, none twice
(a duplicate would come back as a command error), nothing redelivered."""

from __future__ import annotations

import sys
import threading
import time

from sluice import Client
from sluice.client.push import Message
from tests.integration.push.conftest import PushCluster
from tests.integration.push.helpers import eventually, produce


def test_racing_acks_of_the_same_messages_count_and_send_once(
    cluster: PushCluster, client: Client, topic: str
) -> None:
    n = 2000
    produce(client, topic, n, key=lambda i: b"k%d" % i)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads interleave inside the acks
    try:
        with client.push_consumer(topic, "race", "shared", initial_position="earliest") as pc:
            got: list[Message] = []
            deadline = time.monotonic() + 30
            while len(got) < n:
                assert time.monotonic() < deadline, f"only {len(got)} of {n} messages arrived"
                msgs = pc.receive_many(500, timeout=1.0)
                got += msgs
                start = threading.Barrier(3)

                def ack_all(batch: list[Message] = msgs, start: threading.Barrier = start) -> None:
                    start.wait(10)
                    for m in batch:
                        pc.ack(m)

                threads = [threading.Thread(target=ack_all) for _ in range(3)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(30)
            assert sorted(int(m.value) for m in got) == list(range(n))
            stats = pc.stats()
            assert stats.acked == n, "each message counted once, whichever thread won"
            assert stats.unacked == 0
            assert pc.receive_many(100, timeout=0.5) == [], "nothing redelivered"
            eventually(
                lambda: cluster.describe(client, topic, "race").summary.backlog == 0,
                what="the dispatcher to see every ack",
            )
            assert pc.stats().command_errors == 0, "no ack sent twice"
    finally:
        sys.setswitchinterval(old)
