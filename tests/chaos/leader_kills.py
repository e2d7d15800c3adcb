"""The leader-kill campaign (issue 14, must-shows 1 and 7), shared by the suite's short run
(``tests/chaos/test_leader_kills.py``) and the full one (``bench/chaos/leader_kills.py``).

Three brokers, a topic of factor 3 and min ISR 2 over several partitions, an SDK producer at a steady rate
(acks=all; idempotent unless told otherwise). ``kills`` times in a row: ``kill -9`` the leader of
partition 0, wait until a new leader is elected, restart the killed broker and wait until it is back in
every ISR. Once in the run (after the kill numbered ``coordinator_kill_after``), ``kill -9`` the
coordinator too and restart it. Then stop the load and read every partition back.

Each leader kill must land on a busy cluster: produce requests were in flight when it landed, and the
producer retried in the kill's window (until the killed broker was back in sync). Both are recorded per
kill, so a run whose kills hit an idle cluster shows it (and the test fails).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.cluster import ChaosCluster, chaos_cluster, until
from tests.chaos.load import Load, RetryLog, Verdict, verify

TOPIC = "chaos"


@dataclass
class Kill:
    victim: int
    #: Partitions the victim led when it was killed: each needs one election.
    led: int
    #: Records sent and not answered at the moment of the kill.
    in_flight: int
    #: Seconds from the kill until the coordinator named a new leader of partition 0.
    leaderless: float
    #: Seconds from the kill until the restarted broker was back in every ISR.
    back_in_sync: float
    #: monotonic times of the kill and of the end of its window.
    killed_at: float
    end: float
    retries: Counter[str] = field(default_factory=Counter)
    #: The longest time partition 0 went without an acknowledgement around the kill (the producer's view
    #: of the failover: detection, election, metadata refresh, retry); set once the load has stopped.
    stall: float = 0.0


@dataclass
class Campaign:
    idempotent: bool
    kills: list[Kill] = field(default_factory=list)
    coordinator_kills: int = 0
    coordinator_back: float = 0.0
    failed_sends: Counter[str] = field(default_factory=Counter)
    verdict: Verdict = field(default_factory=Verdict)
    replicas_identical: bool = False
    #: Leader elections the kills called for, and those that happened (the partitions' leader epochs
    #: summed: every election bumps one): more happened than were called for = false elections.
    elections_expected: int = 0
    elections: int = 0
    seconds: float = 0.0

    def summary(self) -> dict[str, object]:
        return {
            "idempotent": self.idempotent,
            "leader_kills": len(self.kills),
            "coordinator_kills": self.coordinator_kills,
            **self.verdict.as_dict(),
            "failed_sends": dict(self.failed_sends),
            "replicas_identical": self.replicas_identical,
            "elections": self.elections,
            "false_elections": self.elections - self.elections_expected,
            "kills_with_requests_in_flight": sum(1 for k in self.kills if k.in_flight > 0),
            "kills_with_retries": sum(1 for k in self.kills if sum(k.retries.values()) > 0),
            "retries_per_kill": [sum(k.retries.values()) for k in self.kills],
            "retry_errors": dict(sum((k.retries for k in self.kills), Counter())),
            "leaderless_s": [round(k.leaderless, 2) for k in self.kills],
            "produce_stall_s": [round(k.stall, 2) for k in self.kills],
            "back_in_sync_s": [round(k.back_in_sync, 1) for k in self.kills],
            "coordinator_back_s": round(self.coordinator_back, 2),
            "seconds": round(self.seconds, 1),
        }


def _kill_leader(cluster: ChaosCluster, load: Load, retries: RetryLog, settle: float) -> Kill:
    # Load on the partition right now: acknowledgements keep coming (the previous kill is behind us).
    acked = load.acked_count()
    until(lambda: load.acked_count() > acked + 20, "the load to be acknowledged before a kill", timeout=60)
    before = cluster.partitions(TOPIC)
    victim = before[0].broker_id
    led = sum(1 for p in before if p.broker_id == victim)
    in_flight = load.in_flight
    killed_at = time.monotonic()
    cluster.kill_broker(victim)
    until(
        lambda: cluster.leader(TOPIC, 0) not in (victim, -1),
        f"a new leader after broker {victim} was killed",
        timeout=60,
        state=lambda: cluster.describe(TOPIC),
    )
    leaderless = time.monotonic() - killed_at
    cluster.start_broker(victim)
    until(
        lambda: cluster.fully_in_sync(TOPIC),
        f"broker {victim} to be back in every ISR",
        timeout=90,
        state=lambda: cluster.describe(TOPIC),
    )
    back = time.monotonic() - killed_at
    # Let the producer run on the healed cluster for a moment, so the window closes on acknowledgements.
    time.sleep(settle)
    end = time.monotonic()
    return Kill(
        victim=victim,
        led=led,
        in_flight=in_flight,
        leaderless=leaderless,
        back_in_sync=back,
        killed_at=killed_at,
        end=end,
        retries=retries.between(killed_at, end),
    )


def _kill_coordinator(cluster: ChaosCluster) -> float:
    """kill -9 the coordinator and start it again on its address; seconds until it serves Metadata with
    every partition led and in sync."""
    killed_at = time.monotonic()
    cluster.kill_coordinator()
    cluster.start_coordinator()
    until(lambda: cluster.fully_in_sync(TOPIC), "the restarted coordinator to serve", timeout=60)
    return time.monotonic() - killed_at


def run(
    data: Path,
    kills: int,
    *,
    idempotent: bool = True,
    partitions: int = 4,
    rate: float = 1_000,
    session: str = "3s",
    coordinator_kill_after: int = 1,
    settle: float = 0.5,
    producer_config: dict[str, Any] | None = None,
) -> Campaign:
    """``producer_config``: ProducerConfig overrides on top of the load's (``tests/chaos/load.py``)."""
    campaign = Campaign(idempotent)
    started = time.monotonic()
    with chaos_cluster(data, session=session) as cluster, RetryLog() as retries:
        cluster.create_topic(TOPIC, partitions)
        load = Load(
            cluster.bootstrap,
            TOPIC,
            partitions,
            rate,
            idempotent=idempotent,
            producer_config=producer_config or {},
        )
        load.start()
        try:
            for n in range(kills):
                campaign.kills.append(_kill_leader(cluster, load, retries, settle))
                if n + 1 == coordinator_kill_after:
                    campaign.coordinator_back = _kill_coordinator(cluster)
                    campaign.coordinator_kills += 1
        finally:
            load.stop()
        for kill in campaign.kills:
            kill.stall = load.longest_stall(0, kill.killed_at, kill.end)
        campaign.failed_sends = load.failed
        until(lambda: cluster.fully_in_sync(TOPIC), "every replica in sync after the load", timeout=60)
        campaign.elections_expected = sum(k.led for k in campaign.kills)
        campaign.elections = sum(p.leader_epoch for p in cluster.partitions(TOPIC))
        read = [cluster.read_partition(TOPIC, p) for p in range(partitions)]
        campaign.verdict = verify(load, read)
        try:
            until(
                lambda: all(cluster.replicas_identical(TOPIC, p) for p in range(partitions)),
                "every replica to hold the leader's bytes",
                timeout=30,
            )
            campaign.replicas_identical = True
        except AssertionError:
            campaign.replicas_identical = False
    campaign.seconds = time.monotonic() - started
    return campaign
