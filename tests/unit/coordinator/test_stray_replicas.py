"""Which logs a registering broker lists are strays the controller removes (coordinator/cluster/strays.py)."""

from __future__ import annotations

from coordinator_context import ClusterContext

from sluice.coordinator.cluster.strays import stray_replicas, unknown_logs
from sluice.coordinator.cluster.unclean import LogReport


def test_only_logs_of_known_partitions_the_broker_no_longer_replicates_are_strays() -> None:
    ctx = ClusterContext()
    for broker in (1, 2):
        ctx.register_broker(broker)
    ctx.create_topic("mine")  # one replica: on broker 1 or 2
    ctx.create_topic("other")
    mine = ctx.state.topics["mine"]
    holder = mine.states[0].replicas[0]
    away = 3 - holder  # the broker the partition is not on
    epoch = mine.states[0].leader_epoch

    def strays(broker: int, *reports: LogReport) -> list[tuple[str, int]]:
        return [(r.topic, r.partition) for r in stray_replicas(ctx.state, broker, reports)]

    def report(topic: str, topic_id: str, partition: int = 0, last_epoch: int = epoch) -> LogReport:
        return LogReport(topic, topic_id, partition, last_epoch, 10)

    # A replica's own log is never a stray.
    assert strays(holder, report("mine", mine.topic_id)) == []
    # A broker holding a log of a partition it is not a replica of: a stray.
    assert strays(away, report("mine", mine.topic_id)) == [("mine", 0)]
    # Not this controller's to judge: another incarnation (a deleted topic), an unknown topic, no id, a
    # partition the topic does not have, or a log that saw a newer leader epoch than the controller knows.
    assert strays(away, report("mine", "id-older")) == []
    assert strays(away, report("gone", "id-9")) == []
    assert strays(away, report("mine", "")) == []
    assert strays(away, report("mine", mine.topic_id, partition=5)) == []
    assert strays(away, report("mine", mine.topic_id, partition=-1)) == []
    assert strays(away, report("mine", mine.topic_id, last_epoch=epoch + 1)) == []
    # Those of unknown incarnations are the ones the controller warns of (and keeps).
    listed = [report("mine", mine.topic_id), report("mine", "id-older"), report("gone", "id-9")]
    assert [(r.topic, r.topic_id) for r in unknown_logs(ctx.state, listed)] == [
        ("mine", "id-older"),
        ("gone", "id-9"),
    ]
