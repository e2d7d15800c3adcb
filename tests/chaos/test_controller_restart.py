"""A leader that dies while the coordinator is down (or before a restarted coordinator heard from it) is
replaced: the coordinator that takes office starts every registered broker's session clock, so one it
never hears from expires after a session timeout (docs/replication.md, "Chaos: leader kills").

Without that, the dead broker stayed "unknown" (not alive, never expired) and its partitions kept a dead
leader for ever: found by the leader-kill campaign, a kill landing just after a coordinator restart.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.chaos.cluster import chaos_cluster, until


def test_a_leader_killed_while_the_coordinator_is_down_is_replaced_after_a_session(tmp_path: Path) -> None:
    with chaos_cluster(tmp_path, session="3s") as cluster:
        cluster.create_topic("t", 2)
        victim = cluster.leader("t", 0)
        cluster.kill_coordinator()
        cluster.kill_broker(victim)
        cluster.start_coordinator()
        started = time.monotonic()
        until(
            lambda: cluster.leader("t", 0) not in (victim, -1),
            f"a new leader for t/0 (broker {victim} died while the coordinator was down)",
            timeout=30,
            state=lambda: cluster.describe("t"),
        )
        # The session timeout (3 s) from the coordinator's start, plus an expiry tick and some slack.
        assert time.monotonic() - started < 3 + 5
        assert all(victim not in p.isr for p in cluster.partitions("t"))
        # The dead broker comes back and rejoins every ISR as a follower.
        cluster.start_broker(victim)
        until(lambda: cluster.fully_in_sync("t"), "the restarted broker to rejoin every ISR", timeout=60)
