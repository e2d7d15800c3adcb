"""Ack grouping (``ack_group_time``) against real processes: individual acks leave as few ``Ack``
commands, ``close()`` writes the acks still grouped, and acks lost with a crashed process before their
group was written are redelivered (at-least-once)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from sluice import Client
from tests.integration.push.conftest import PushCluster
from tests.integration.push.helpers import drain, eventually, nothing_more, produce

SERVICES = Path(__file__).resolve().parents[3] / "services"


def _unacked(cluster: PushCluster, client: Client, topic: str, sub: str) -> int:
    return sum(c.unacked for c in cluster.describe(client, topic, sub).consumers)


def test_individual_acks_leave_as_one_grouped_command(
    cluster: PushCluster, client: Client, topic: str
) -> None:
    n = 500
    produce(client, topic, n)
    # A group time far longer than the acking takes: nothing but the group's end writes them.
    with client.push_consumer(
        topic, "grouped", "shared", initial_position="earliest", ack_group_time="1s"
    ) as pc:
        msgs = drain(pc, n, ack=False)  # taking them sends the refill Flow before any ack
        for i, msg in enumerate(msgs):
            pc.ack(msg)
            if i % 10 == 9:
                time.sleep(0.001)  # the stream's writer gets the GIL: without grouping it would write
        eventually(lambda: _unacked(cluster, client, topic, "grouped") == 0, what="acks reach the dispatcher")
        stats = pc.stats()
        assert stats.acked == n
        # 500 individual acks in ~50 ms: one Ack command (a few if the load stretched the loop past
        # the group's second); written as they come, ~50 of them.
        assert 1 <= stats.ack_commands <= 3, stats.ack_commands


def test_close_writes_the_acks_still_grouped(cluster: PushCluster, client: Client, topic: str) -> None:
    n = 300
    produce(client, topic, n)
    pc = client.push_consumer(topic, "close", "shared", initial_position="earliest", ack_group_time="60s")
    drain(pc, n)  # receive() + ack() each: all of them wait in the group
    assert pc.stats().ack_commands == 0
    pc.close()
    with client.push_consumer(topic, "close", "shared", initial_position="earliest") as again:
        assert nothing_more(again, wait=1.0)
    eventually(lambda: cluster.describe(client, topic, "close").summary.backlog == 0, what="backlog 0")


def test_acks_lost_in_a_crash_are_redelivered(cluster: PushCluster, client: Client, topic: str) -> None:
    n = 200
    produce(client, topic, n)
    # A consumer process that acks everything and dies before its 60 s group was written.
    script = textwrap.dedent(
        f"""
        import os
        import time
        from sluice import Client
        client = Client({cluster.bootstrap!r})
        pc = client.push_consumer({topic!r}, "crash", "shared", initial_position="earliest",
                                  ack_group_time="60s")
        got = 0
        while got < {n}:
            msg = pc.receive(timeout=20)
            pc.ack(msg)
            got += 1
            if got % 10 == 0:
                time.sleep(0.001)  # the writer gets the GIL: acks not grouped would leave now
        assert pc.stats().acked == {n} and pc.stats().ack_commands == 0
        print("acked", got, flush=True)
        os._exit(0)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(SERVICES))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert b"acked 200" in done.stdout
    with client.push_consumer(topic, "crash", "shared", initial_position="earliest") as pc:
        again = drain(pc, n)
        assert sorted(int(m.value) for m in again) == list(range(n))
        assert {m.redelivery_count for m in again} == {1}
        assert nothing_more(pc)
