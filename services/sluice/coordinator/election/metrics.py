"""``sluice_coordinator_election_*`` metrics (created once per process: prometheus-client's registry is
global, and tests run several electors in one process)."""

from __future__ import annotations

from dataclasses import dataclass
from threading import Lock

from prometheus_client import Counter, Gauge


@dataclass(frozen=True)
class ElectionMetrics:
    #: 1 while this replica is the serving leader.
    leader: Gauge
    #: The fencing epoch of this replica's current or last term as leader.
    epoch: Gauge
    #: Leadership changes seen by this replica, by the state entered ("leader" or "follower").
    transitions: Counter


_metrics: ElectionMetrics | None = None
_lock = Lock()


def election_metrics() -> ElectionMetrics:
    global _metrics
    with _lock:
        if _metrics is None:
            p = "sluice_coordinator_election"
            _metrics = ElectionMetrics(
                leader=Gauge(f"{p}_leader", "1 while this coordinator replica is the elected leader"),
                epoch=Gauge(f"{p}_epoch", "Fencing epoch of this replica's latest term as leader"),
                transitions=Counter(
                    f"{p}_transitions", "Times this replica became leader or stepped down", ["to"]
                ),
            )
        return _metrics
