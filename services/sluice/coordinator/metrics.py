"""``sluice_coordinator_*`` metrics beyond the per-RPC ones every service has.

Created once per process (prometheus-client's registry is global), so building several services in one
process (tests) does not register a name twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from threading import Lock

from prometheus_client import Counter, Gauge, Histogram

from sluice.coordinator.cluster.health import ReplicaHealth
from sluice.coordinator.cluster.state import ClusterState
from sluice.coordinator.groups.model import GroupState
from sluice.coordinator.groups.state import GroupsState

#: Why the coordinator removes a member (``sluice_coordinator_fenced_members_total{reason}``). Every
#: group's series start at 0 for each, so ``rate()``/``increase()`` see the first fencing.
FENCE_REASONS = ("session_timeout", "rebalance_timeout")

#: (group, track, topic, partition): the labels of the lag gauges.
LagKey = tuple[str, str, str, str]


@dataclass(frozen=True)
class CoordinatorMetrics:
    brokers_alive: Gauge
    brokers_registered: Gauge
    dispatchers_alive: Gauge
    topics: Gauge
    partitions: Gauge
    partitions_under_replicated: Gauge
    partitions_offline: Gauge
    partitions_reassigning: Gauge
    metadata_version: Gauge
    epoch: Gauge
    broker_updates: Counter
    session_expirations: Counter
    leader_elections: Counter
    group_members: Gauge
    groups: Gauge
    group_state: Gauge
    rebalances: Counter
    rebalance_duration: Histogram
    fenced_members: Counter
    consumer_lag: Gauge
    consumer_lag_seconds: Gauge
    groups_not_exported: Gauge
    #: Cached counts behind the replica gauges (not a metric).
    replica_health: ReplicaHealth = field(default_factory=ReplicaHealth)

    def refresh(self, cluster: ClusterState, now_ms: int) -> None:
        """Recompute the gauges from the state (cheap: one pass over brokers, dispatchers and topics)."""
        self.brokers_alive.set(len(cluster.live_brokers(now_ms)))
        self.brokers_registered.set(len(cluster.brokers))
        self.dispatchers_alive.set(len(cluster.live_dispatchers(now_ms)))
        self.topics.set(len(cluster.topics))
        self.partitions.set(cluster.partition_count())
        under, offline = self.replica_health.count(cluster.topics)
        self.partitions_under_replicated.set(under)
        self.partitions_offline.set(offline)
        self.partitions_reassigning.set(self.replica_health.reassigning)
        self.metadata_version.set(cluster.metadata_version)

    def refresh_groups(self, groups: GroupsState, known: set[str], selected: Iterable[str]) -> set[str]:
        """Group gauges from the state for the ``selected`` groups (``group_metrics.py`` bounds them);
        series of groups no longer selected (or gone) are removed; every group is counted by state.
        Returns the groups exported now (the caller passes it back next time)."""
        by_state = dict.fromkeys(GroupState, 0)
        empty = 0
        for name, g in groups.groups.items():
            if not g.exists:
                continue
            if name in groups.live:
                by_state[g.state()] += 1
            else:
                empty += 1  # no members: EMPTY, without building a summary of each of thousands
        by_state[GroupState.EMPTY] += empty
        now_known = set()
        for name in selected:
            group = groups.groups.get(name)
            if group is None or not group.exists:
                continue
            now_known.add(name)
            if name not in known:
                self.start_group_series(name)
            state = group.state()
            self.group_members.labels(name).set(len(group.members))
            for s in GroupState:
                self.group_state.labels(name, s.value).set(1 if s is state else 0)
        for gone in known - now_known:
            self._remove_group_series(gone)
        for s, count in by_state.items():
            self.groups.labels(s.value).set(count)
        self.groups_not_exported.set(sum(by_state.values()) - len(now_known))
        return now_known

    def start_group_series(self, group: str) -> None:
        """Counters and the histogram of a group exist from when the group does, at 0: a query's first
        ``increase()`` then counts the first rebalance or fencing instead of missing it."""
        self.rebalances.labels(group)
        self.rebalance_duration.labels(group)
        for reason in FENCE_REASONS:
            self.fenced_members.labels(group, reason)

    def _remove_group_series(self, group: str) -> None:
        self.group_members.remove(group)
        for state in GroupState:
            self.group_state.remove(group, state.value)
        self.rebalances.remove(group)
        self.rebalance_duration.remove(group)
        for reason in FENCE_REASONS:
            self.fenced_members.remove(group, reason)

    def count_fenced(self, group: str, reason: str) -> None:
        self.fenced_members.labels(group, reason).inc()

    def set_lag(
        self, lag: dict[LagKey, int], seconds: dict[LagKey, float], known: set[LagKey]
    ) -> set[LagKey]:
        """Set both lag gauges; series of partitions no longer read (or whose value is unknown now)
        are removed. Returns the keys exported now (the caller passes them back next time)."""
        for key, value in lag.items():
            self.consumer_lag.labels(*key).set(value)
        for key, secs in seconds.items():
            self.consumer_lag_seconds.labels(*key).set(secs)
        for gone in known - set(lag):
            self.consumer_lag.remove(*gone)
        for gone in known - set(seconds):
            with contextlib.suppress(KeyError):  # never had a value (its timestamp was unknown)
                self.consumer_lag_seconds.remove(*gone)
        return set(lag) | set(seconds)

    def clear_groups(self) -> None:
        """Drop every group and lag gauge series and zero the per-state group counts: this replica
        stopped leading, and a standby must not keep exporting the state it last saw (the leader
        exports the current one). Counters and the histogram count events that did happen here, so
        they stay; ``increase()`` over a standby's is 0."""
        for metric in (self.group_members, self.group_state, self.consumer_lag, self.consumer_lag_seconds):
            metric.clear()
        for state in GroupState:
            self.groups.labels(state.value).set(0)
        self.groups_not_exported.set(0)

    def count_update(self, ok: bool) -> None:
        self.broker_updates.labels("ok" if ok else "failed").inc()


#: The ``kind`` values of ``sluice_coordinator_leader_elections_total`` (timers.py counts them).
ELECTION_KINDS = ("clean", "unclean", "offline", "recovery")

_metrics: CoordinatorMetrics | None = None
_lock = Lock()


def coordinator_metrics() -> CoordinatorMetrics:
    global _metrics
    with _lock:
        if _metrics is None:
            p = "sluice_coordinator"
            _metrics = CoordinatorMetrics(
                brokers_alive=Gauge(
                    f"{p}_brokers_alive", "Registered brokers that heartbeated within the session timeout"
                ),
                brokers_registered=Gauge(f"{p}_brokers_registered", "Brokers ever registered (alive or not)"),
                dispatchers_alive=Gauge(
                    f"{p}_dispatchers_alive", "Dispatchers alive within their session timeout"
                ),
                topics=Gauge(f"{p}_topics", "Topics"),
                partitions=Gauge(f"{p}_partitions", "Partitions over all topics"),
                partitions_under_replicated=Gauge(
                    f"{p}_partitions_under_replicated",
                    "Partitions whose in-sync replicas are fewer than their replicas",
                ),
                partitions_offline=Gauge(f"{p}_partitions_offline", "Partitions without a leader"),
                partitions_reassigning=Gauge(
                    f"{p}_partitions_reassigning", "Partitions with a reassignment in progress"
                ),
                metadata_version=Gauge(f"{p}_metadata_version", "Current cluster metadata version"),
                epoch=Gauge(f"{p}_epoch", "This coordinator's epoch (its fencing token in Redis)"),
                broker_updates=Counter(
                    f"{p}_broker_updates", "UpdatePartitions pushes to brokers, by result", ["result"]
                ),
                session_expirations=Counter(
                    f"{p}_session_expirations", "Broker and dispatcher sessions that timed out", ["kind"]
                ),
                leader_elections=Counter(
                    f"{p}_leader_elections",
                    "Partition leader changes after a broker's loss: clean (from the ISR or ELR), unclean "
                    "(records lost), offline (no leader left), recovery (every eligible replica restarted "
                    "unclean: the longest log elected)",
                    ["kind"],
                ),
                group_members=Gauge(f"{p}_group_members", "Members of a consumer group", ["group"]),
                groups=Gauge(f"{p}_groups", "Consumer groups by state", ["state"]),
                group_state=Gauge(
                    f"{p}_group_state", "1 for the state a consumer group is in, else 0", ["group", "state"]
                ),
                rebalances=Counter(
                    f"{p}_rebalances",
                    "Times a consumer group left the stable state (a rebalance began)",
                    ["group"],
                ),
                rebalance_duration=Histogram(
                    f"{p}_rebalance_duration_seconds",
                    "From a group leaving the stable state until every member holds its target",
                    ["group"],
                    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
                ),
                fenced_members=Counter(
                    f"{p}_fenced_members",
                    "Group members removed by the coordinator (session_timeout, rebalance_timeout)",
                    ["group", "reason"],
                ),
                consumer_lag=Gauge(
                    f"{p}_consumer_lag",
                    "Records between a group's committed offset and the high watermark",
                    ["group", "track", "topic", "partition"],
                ),
                groups_not_exported=Gauge(
                    f"{p}_groups_not_exported",
                    "Consumer groups without per-group series (over --group-metrics-max, or not named by "
                    "--group-metrics-groups); sluice_coordinator_groups counts them all",
                ),
                consumer_lag_seconds=Gauge(
                    f"{p}_consumer_lag_seconds",
                    "Age of the first unconsumed record (now minus the timestamp of the record at the "
                    "committed offset); 0 when caught up",
                    ["group", "track", "topic", "partition"],
                ),
            )
            # Every kind exported from the start at 0: the dashboards' rates and the unclean-election
            # alert's increase() see the first election (a series born at 1 has no increase to show).
            for kind in ELECTION_KINDS:
                _metrics.leader_elections.labels(kind)
        return _metrics
