"""Must show 7 of issue 14: without idempotence a retry after a lost answer writes a record twice; with it
(the SDK default), once.

Deterministic, no race: one follower is paused (SIGSTOP) while staying in the ISR (a long lag bound and
session), so an acks=all batch is appended on the leader and the other follower but cannot commit. The
leader answers REQUEST_TIMED_OUT after the request's timeout (1 s): the answer the producer needed is
lost, though the write landed. The producer retries; then the follower resumes and everything commits.
Reading the partition back counts the copies.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.cluster import chaos_cluster, until
from tests.chaos.load import RetryLog


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "not-idempotent"])
def test_a_retry_after_a_lost_answer_duplicates_only_without_idempotence(
    tmp_path: Path, idempotent: bool
) -> None:
    from sluice.client import Client

    with chaos_cluster(tmp_path, session="60s", lag="60s") as cluster, RetryLog() as retries:
        cluster.create_topic("dup", 1)
        leader = cluster.leader("dup", 0)
        paused = next(b for b in cluster.brokers if b != leader)
        with Client(cluster.bootstrap) as client:
            producer = client.producer(
                "dup", enable_idempotence=idempotent, request_timeout="1s", retries=100, linger="0ms"
            )
            assert producer.send(b"before", partition=0).result(30).offset == 0
            cluster.pause(paused)
            future = producer.send(b"once", partition=0)
            # The first answer is REQUEST_TIMED_OUT (the write sits uncommitted); wait for two retries,
            # so at least one retry reached the leader while the first write was there.
            until(lambda: len(retries.retries) >= 2, "the producer to retry the timed-out batch", timeout=30)
            assert {kind for _, kind in retries.retries} == {"RequestTimedOut"}
            cluster.resume(paused)
            acknowledged_at = future.result(60).offset
            producer.close()
        until(lambda: cluster.fully_in_sync("dup"), "the paused follower back in sync")
        values = cluster.read_partition("dup", 0)
    copies = values.count(b"once")
    if idempotent:
        assert values == [b"before", b"once"]
        assert acknowledged_at == 1  # the retry was answered with the first write's offset
    else:
        # Every attempt that reached the leader was written: duplicates, and the answer names the last.
        assert copies >= 2, values
        assert acknowledged_at == len(values) - 1
