"""Push subscriptions and the Spark source across an unclean election that truncates records they read
(KIP-320; docs/dispatcher.md, "Across a leader change"; docs/spark.md, "Offsets and leader epochs").

Real processes: three brokers (factor 3, min ISR 1, unclean election on), an offset store, a dispatcher.
The followers die, the leader alone commits 10 more records (20..29), consumers read them, then the leader
dies too and a follower that never had them is elected uncleanly and takes writes at 20. Without the
leader-epoch checks the dispatcher waits at 30, past the new log's end, for records that will never be
there, and the Spark source plans nothing from 30: the new leader's records at 20.. are never read.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from sluice import Client
from sluice.client.push import Message, PushConsumer
from sluice.errors import OffsetOutOfRange
from sluice.spark.epochs import split_offsets
from sluice.spark.options import parse_options
from sluice.spark.source import SluiceStreamReader
from tests.harness import ServiceProcess, start_service
from tests.integration.broker.conftest import make_batch
from tests.integration.broker.test_replication import Cluster, isr, until
from tests.integration.client.test_consumers_failover import failover_cluster

TOPIC = "unc"


def metric(proc: ServiceProcess, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(f"http://{proc.metrics}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"([a-z_]+)(\{[^}]*\})? (\S+)", line)
        if m and m.group(1) == name and all(f'{k}="{v}"' in (m.group(2) or "") for k, v in labels.items()):
            total += float(m.group(3))
    return total


def receive(consumer: PushConsumer, n: int, timeout: float = 30) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"received {out} of {n} messages"
        out += [(m.offset, m.value or b"") for m in consumer.receive_many(n - len(out), timeout=0.5)]
    return out


def lone_leader_writes(cluster: Cluster, client: Client, kept: int = 20, lost: int = 10) -> int:
    """``kept`` records on every replica, then ``lost`` more on the leader alone; returns the leader's id."""
    client.admin.create_topic(
        TOPIC, replication_factor=3, min_insync_replicas=1, unclean_leader_election=True
    )
    until(lambda: cluster.partition(TOPIC).broker_id >= 0, "a leader")
    leader = cluster.partition(TOPIC).broker_id
    followers = [i for i in sorted(cluster.brokers) if i != leader]
    producer = client.producer(TOPIC, linger="1ms", delivery_timeout="60s")
    for i in range(kept):
        producer.send(b"a%d" % i)
    producer.flush(30)
    until(
        lambda: all(cluster.segments(f, TOPIC) == cluster.segments(leader, TOPIC) for f in followers),
        "the followers to hold the first records",
    )
    for f in followers:
        cluster.brokers[f].kill()
        cluster.brokers[f].close()
    until(lambda: isr(cluster, TOPIC) == [leader], "the ISR to shrink to the leader", timeout=30)
    for i in range(lost):
        producer.send(b"lost%d" % i)
    producer.flush(30)  # acks=all with min ISR 1: committed by the leader alone
    producer.close()
    return leader


def unclean_election(cluster: Cluster, leader: int) -> None:
    """The leader dies; a follower without the lone leader's records returns, is elected, and takes n0, n1
    where they began."""
    cluster.brokers[leader].kill()
    cluster.brokers[leader].close()
    follower = next(i for i in sorted(cluster.brokers) if i != leader)
    cluster.start_broker(follower)
    until(lambda: cluster.partition(TOPIC).broker_id == follower, "an unclean election", timeout=30)
    new_leader = cluster.brokers[follower]
    until(
        lambda: new_leader.produce(TOPIC, 0, make_batch([b"n0", b"n1"]), acks=1).error.code == 0,
        "a write on the new leader",
    )


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Cluster, list[ServiceProcess], Client]]:
    with failover_cluster(tmp_path) as (cluster, others), Client(cluster.coordinator.address) as client:
        yield cluster, others, client


def test_a_feed_moves_its_subscription_back_over_a_truncation_and_sends_nothing_of_the_old_log(
    stack: tuple[Cluster, list[ServiceProcess], Client],
) -> None:
    """A consumer read 0..29 and acked 0..24 (25..29 in flight) when the election truncates 20..29: the
    feed asks the new leader where its epoch ends (20), the subscription goes back there, and the consumer
    gets the new leader's records at 20 and 21; nothing of the old log is sent again. Counted once."""
    cluster, others, client = stack
    dispatcher = others[1]
    leader = lone_leader_writes(cluster, client)
    consumer = client.push_consumer(TOPIC, "live", "shared", initial_position="earliest")
    messages: list[Message] = []
    deadline = time.monotonic() + 30
    while len(messages) < 30 and time.monotonic() < deadline:
        messages += consumer.receive_many(30 - len(messages), timeout=0.5)
    assert [m.offset for m in messages] == list(range(30))
    for m in messages[:25]:
        consumer.ack(m)
    unclean_election(cluster, leader)
    after: list[Message] = []
    deadline = time.monotonic() + 30
    while len(after) < 2 and time.monotonic() < deadline:
        after += consumer.receive_many(2 - len(after), timeout=0.5)
    assert [(m.offset, m.value) for m in after] == [(20, b"n0"), (21, b"n1")]
    for m in after:
        consumer.ack(m)
    until(
        lambda: metric(dispatcher, "sluice_dispatcher_log_truncations_total", found_by="feed") == 1, "count"
    )
    # 25..29 of the old log were in flight at this consumer: it leaves, and none of them goes to the next.
    consumer.close()
    successor = client.push_consumer(TOPIC, "live", "shared")
    assert successor.receive_many(10, timeout=2.0) == []
    successor.close()


def test_a_restarted_dispatcher_and_the_spark_source_check_their_positions_with_the_new_leader(
    stack: tuple[Cluster, list[ServiceProcess], Client],
) -> None:
    """A durable cursor at 30 (read in the old epoch) and a Spark offset at 30 outlive the election: the
    dispatcher, restarted after it, checks the cursor before serving it and delivers from 20; the Spark
    source fails the query (failOnDataLoss=true) or plans [20, 22) (false), counting the truncation."""
    cluster, others, client = stack
    leader = lone_leader_writes(cluster, client)
    dispatcher = others[1]
    consumer = client.push_consumer(TOPIC, "kept", "exclusive", initial_position="earliest")
    messages: list[Message] = []
    deadline = time.monotonic() + 30
    while len(messages) < 30 and time.monotonic() < deadline:
        messages += consumer.receive_many(30 - len(messages), timeout=0.5)
    assert [m.offset for m in messages] == list(range(30))
    for m in messages:
        consumer.ack(m)
    options = {"bootstrap": cluster.coordinator.address, "topic": TOPIC}
    spark = SluiceStreamReader(parse_options(options, streaming=True))
    checkpoint = spark.latestOffset(spark.initialOffset(), ReadAllAvailable())
    assert split_offsets(checkpoint)[0] == {f"{TOPIC}/0": 30}
    # Everything acknowledged and persisted (the cursor carries the old epoch), then the dispatcher dies.
    until(
        lambda: metric(dispatcher, "sluice_dispatcher_acked_messages_total", subscription="kept") == 30,
        "acks",
    )
    until(lambda: metric(dispatcher, "sluice_dispatcher_cursors_dirty", subscription="kept") == 0, "a save")
    consumer.close()
    dispatcher.kill()
    unclean_election(cluster, leader)
    restarted = start_service(
        "dispatcher",
        *("--port", "0", "--metrics-port", "0", "--coordinator", cluster.coordinator.address),
        *("--dispatcher-id", "d0", "--cursor-flush-interval", "50ms"),
    )
    others.append(restarted)
    resumed = client.push_consumer(TOPIC, "kept", "exclusive", initial_position="earliest")
    assert receive(resumed, 2) == [(20, b"n0"), (21, b"n1")]
    assert metric(restarted, "sluice_dispatcher_log_truncations_total", found_by="cursor_load") == 1
    resumed.close()
    # The Spark source: the offset checkpointed at 30 in the old epoch.
    strict = SluiceStreamReader(parse_options(options, streaming=True))
    with pytest.raises(OffsetOutOfRange, match=r"records 20\.\.29 of unc/0, .* unclean leader election"):
        strict.latestOffset(checkpoint, ReadAllAvailable())
    lenient = SluiceStreamReader(parse_options({**options, "failOnDataLoss": "false"}, streaming=True))
    end = lenient.latestOffset(checkpoint, ReadAllAvailable())
    assert split_offsets(end)[0] == {f"{TOPIC}/0": 22}
    planned = lenient.partitions(checkpoint, end)
    assert [(p.range.start, p.range.end) for p in planned] == [(20, 22)]  # type: ignore[attr-defined]
    assert lenient.truncations == 1


def test_a_late_ack_of_a_truncated_record_does_not_ack_the_new_record_at_its_offset(
    stack: tuple[Cluster, list[ServiceProcess], Client],
) -> None:
    """A consumer got 0..29 and acked 0..19 when the election truncates 20..29; the new leader's records
    at 20 and 21 come to the same consumer. Then the consumer acks the old 20..29, late (docs/dispatcher.md,
    "Acks across a truncation"): the acks carry the old epoch, and the dispatcher refuses those of 20 and 21
    (counted) instead of acknowledging the new records there, which the consumer never acked: the next
    consumer gets them. Without the check the new records would be acknowledged by the old acks, unseen."""
    cluster, others, client = stack
    dispatcher = others[1]
    leader = lone_leader_writes(cluster, client)
    consumer = client.push_consumer(TOPIC, "late", "shared", initial_position="earliest")
    old: list[Message] = []
    deadline = time.monotonic() + 30
    while len(old) < 30 and time.monotonic() < deadline:
        old += consumer.receive_many(30 - len(old), timeout=0.5)
    assert [m.offset for m in old] == list(range(30))
    consumer.ack_many(old[:20])
    unclean_election(cluster, leader)
    new: list[Message] = []
    deadline = time.monotonic() + 30
    while len(new) < 2 and time.monotonic() < deadline:
        new += consumer.receive_many(2 - len(new), timeout=0.5)
    assert [(m.offset, m.value) for m in new] == [(20, b"n0"), (21, b"n1")]
    epochs = (old[20].leader_epoch, new[0].leader_epoch)
    assert None not in epochs
    assert epochs[0] < epochs[1]  # type: ignore[operator]
    consumer.ack_many(old[20:])  # the late acks of the records that are gone
    until(
        lambda: (
            metric(dispatcher, "sluice_dispatcher_epoch_refused_acks_total", subscription="late", kind="ack")
            == 2
        ),
        "the refused acks of 20 and 21",
    )
    consumer.close()
    successor = client.push_consumer(TOPIC, "late", "shared")
    assert receive(successor, 2) == [(20, b"n0"), (21, b"n1")]
    successor.close()
