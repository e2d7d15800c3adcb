"""Five batches of a partition in flight across a leader kill (issue 14: the idempotent producer pipelines up
to ``max_in_flight`` batches per partition, ordered by sequence numbers).

Three brokers, factor 3, min ISR 2, an SDK producer (acks=all, idempotence, linger 0, records of about 1 KB
that fill a 1 KiB batch each) at 2,000 records/s over two partitions. Once partition 0 has five batches in
flight, ``kill -9`` its leader. The batches in flight fail, go again in order to the new leader (which answers
those it already holds as duplicates, with their first offsets), and every acknowledged record is read back
exactly once, in order per partition, with no gap. The long run of many kills is
``tests/chaos/test_leader_kills.py`` / ``bench/chaos/leader_kills.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.chaos.cluster import chaos_cluster, until
from tests.chaos.load import Load, RetryLog, verify

TOPIC = "inflight"
PARTITIONS = 2


def test_a_leader_kill_with_five_batches_in_flight_loses_duplicates_and_reorders_nothing(
    tmp_path: Path,
) -> None:
    with chaos_cluster(tmp_path) as cluster, RetryLog() as retries:
        cluster.create_topic(TOPIC, PARTITIONS)
        # Records that fill a batch each: only full batches pipeline (a partial one waits for the
        # partition's answers, docs/producer.md), and the pipeline is what this test kills into.
        load = Load(
            cluster.bootstrap,
            TOPIC,
            PARTITIONS,
            rate=2_000,
            producer_config={"linger": "0ms", "batch_size": 1024},
            value_padding=900,
        )
        load.start()
        try:
            until(lambda: load.acked_count() > 1_000, "the load to be acknowledged", timeout=30)
            victim = cluster.leader(TOPIC, 0)
            producer = load.producer
            assert producer is not None
            # Bounded wait for the moment the pipeline is full (records at 1,000/s per partition against
            # commits of a few ms); the kill lands on it at once.
            until(lambda: producer.in_flight(0) >= 5, "five batches of partition 0 in flight", step=0.0005)
            killed_at = time.monotonic()
            cluster.kill_broker(victim)
            still_in_flight = producer.in_flight(0)  # what the kill cut off (answers may have come since)
            until(
                lambda: cluster.leader(TOPIC, 0) not in (victim, -1),
                f"a new leader after broker {victim} was killed",
                state=lambda: cluster.describe(TOPIC),
            )
            acked = load.acked_count()
            until(lambda: load.acked_count() > acked + 1_000, "the load to flow again", timeout=30)
        finally:
            load.stop()
        seen = retries.between(killed_at, time.monotonic())
        read = [cluster.read_partition(TOPIC, p) for p in range(PARTITIONS)]
    verdict = verify(load, read)
    summary = {
        **verdict.as_dict(),
        "in_flight_after_kill": still_in_flight,
        "retries": dict(seen),
        "failed": dict(load.failed),
    }
    assert (verdict.lost, verdict.duplicates, verdict.out_of_order, verdict.gaps) == (0, 0, 0, 0), summary
    assert verdict.acked > 2_000, summary
    assert verdict.consumed == verdict.acked, summary
    assert not load.failed, summary  # the failover was hidden from the user
    assert sum(seen.values()) > 0, summary  # the kill cut requests off: the producer retried them
