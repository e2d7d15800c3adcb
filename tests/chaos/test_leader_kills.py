"""Must show 1 and 7 of issue 14, the suite's short run (the full one: ``bench/chaos/leader_kills.py``).

Three brokers, factor 3, min ISR 2, an SDK producer at load (acks=all, idempotence: the defaults) over 4
partitions. kill -9 the leader of partition 0 three times in a row (restarting it and waiting until it is
back in every ISR before the next), and kill -9 the coordinator once. Every acknowledged record is read
back exactly once, in order per partition, and each kill hit produce requests in flight: records were
unanswered when it landed and the producer retried in its window (the test fails on an idle cluster).
"""

from __future__ import annotations

from pathlib import Path

from tests.chaos.leader_kills import run


def test_three_leader_kills_and_a_coordinator_kill_lose_and_duplicate_nothing_acknowledged(
    tmp_path: Path,
) -> None:
    campaign = run(tmp_path, kills=3, rate=500, coordinator_kill_after=1)
    summary = campaign.summary()
    v = campaign.verdict
    assert (v.lost, v.duplicates, v.out_of_order, v.gaps) == (0, 0, 0, 0), summary
    assert v.acked > 1_000, summary
    assert v.consumed == v.acked, summary
    assert not campaign.failed_sends, summary  # the producer's retries hid every failover
    assert campaign.coordinator_kills == 1
    assert campaign.replicas_identical, summary
    # False elections (campaign.elections above elections_expected) are reported by the bench, not
    # asserted here: with a 3 s session they depend on how loaded the machine is, not on the code.
    for n, kill in enumerate(campaign.kills):
        assert kill.in_flight > 0, f"kill {n} landed with nothing in flight: {summary}"
        assert sum(kill.retries.values()) > 0, f"kill {n}: the producer never retried: {summary}"
