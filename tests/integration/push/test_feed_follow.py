"""The dispatcher's feeds follow a continuous fetch on the broker's wire port (docs/wire.md):
they survive the broker's death and restart (elsewhere, or without a wire port), and stop
reading while every subscription is full."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections.abc import Iterator

import pytest

from sluice import Client
from sluice.client.links import TRANSPORT_ENV
from sluice.client.push import Message
from sluice.common.wire_aio import FetchFollower
from sluice.errors import BrokerNotAvailable
from sluice.server.runtime import EVENT_LOOP_ENV, event_loop_runner
from sluice.v1 import broker_pb2
from tests.harness import free_port, start_service
from tests.integration.push.conftest import PushCluster, run_push_cluster
from tests.integration.push.helpers import drain, nothing_more, produce
from tests.wire_client import settle_connections


@pytest.fixture
def own_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[PushCluster]:
    # The SDK on gRPC: every wire connection the broker counts is a dispatcher feed's.
    monkeypatch.setenv(TRANSPORT_ENV, "grpc")
    with run_push_cluster() as cluster:
        try:
            yield cluster
        finally:
            cluster.broker.terminate()  # a restarted broker is not the one the cluster started


def restart_broker(cluster: PushCluster, wire: bool = True) -> None:
    """kill -9 of the broker, then the same broker (id, data) again, on new ports; ``wire=False``:
    serving no wire port (set in a config file: the command line takes no negative port)."""
    cluster.broker.kill()
    args = list(cluster.broker.args)
    if "--config" in args:
        i = args.index("--config")
        del args[i : i + 2]
    if not wire:
        config = cluster.data_dir / "no-wire.toml"
        config.write_text("wire_port = -1\n")
        args += ["--config", str(config)]
    cluster.broker = start_service("broker", *args)


def produce_after_restart(client: Client, topic: str, values: list[bytes]) -> None:
    """Produce once the coordinator sends the producer to the restarted broker."""
    deadline = time.monotonic() + 30
    with client.producer(topic, linger=0) as producer:
        for value in values:
            while True:
                try:
                    producer.send(value).result(timeout=10)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)


def values(messages: list[Message]) -> list[bytes]:
    return [m.value for m in messages]


def fetches_served(cluster: PushCluster) -> float:
    """Fetch requests the broker served (each answer of a continuous fetch counts as one)."""
    text = urllib.request.urlopen(f"http://{cluster.broker.metrics}/metrics", timeout=10).read().decode()
    return sum(
        float(m.group(1))
        for m in re.finditer(
            r'^sluice_broker_rpc_requests_total\{[^}]*method="Fetch"[^}]*\} (\S+)$', text, re.M
        )
    )


def test_a_feed_follows_the_broker_through_kill_9_and_restart(own_cluster: PushCluster) -> None:
    cluster = own_cluster
    with Client(cluster.bootstrap, request_timeout=10) as client:
        client.admin.create_topic("follow-restart", partitions=2)
        produce(client, "follow-restart", 20)
        with client.push_consumer("follow-restart", "s", "shared", initial_position="earliest") as pc:
            assert sorted(int(v) for v in values(drain(pc, 20))) == list(range(20))
            settle_connections(cluster.broker.metrics, "broker", 2)  # one follower per partition

            # The broker dies mid-follow and comes back on other ports: the feeds learn where
            # from the coordinator and follow it there.
            restart_broker(cluster)
            produce_after_restart(client, "follow-restart", [b"after-%d" % i for i in range(20)])
            got = values(drain(pc, 20, timeout=60))
            assert sorted(got) == sorted(b"after-%d" % i for i in range(20))
            assert nothing_more(pc)
            settle_connections(cluster.broker.metrics, "broker", 2)


def test_a_feed_falls_back_to_grpc_when_the_broker_loses_its_wire_port(own_cluster: PushCluster) -> None:
    cluster = own_cluster
    with Client(cluster.bootstrap, request_timeout=10) as client:
        client.admin.create_topic("follow-grpc", partitions=1)
        produce(client, "follow-grpc", 5)
        with client.push_consumer("follow-grpc", "s", "exclusive", initial_position="earliest") as pc:
            assert values(drain(pc, 5)) == [b"%d" % i for i in range(5)]

            restart_broker(cluster, wire=False)  # the feed now reads a FetchStream
            produce_after_restart(client, "follow-grpc", [b"grpc-%d" % i for i in range(5)])
            assert values(drain(pc, 5, timeout=60)) == [b"grpc-%d" % i for i in range(5)]
            # Parked long-polls answer as records arrive.
            produce_after_restart(client, "follow-grpc", [b"grpc-late"])
            assert values(drain(pc, 1)) == [b"grpc-late"]

            restart_broker(cluster)  # a wire port again: back to following
            produce_after_restart(client, "follow-grpc", [b"wire-%d" % i for i in range(5)])
            assert values(drain(pc, 5, timeout=60)) == [b"wire-%d" % i for i in range(5)]
            settle_connections(cluster.broker.metrics, "broker", 1)
            assert nothing_more(pc)


#: Seconds a follower may hear nothing before it calls the broker hung: the dispatcher's
#: fetch_max_wait (500 ms by default) plus feed.FETCH_GRACE.
HUNG_AFTER_S = 10.5


def test_a_feed_stops_reading_while_every_subscription_is_full(own_cluster: PushCluster) -> None:
    cluster = own_cluster
    # Far more than the subscription's read-ahead (1 MiB) and what the socket buffers between the
    # broker and the dispatcher hold: a follower that kept reading would keep the broker fetching.
    n, size = 640, 64 * 1024
    with Client(cluster.bootstrap, request_timeout=10) as client:
        client.admin.create_topic("follow-full", partitions=1)
        with client.producer("follow-full", linger="5ms") as producer:
            futures = [producer.send(b"%06d" % i + b"x" * (size - 6)) for i in range(n)]
            producer.flush()
            for f in futures:
                f.result(timeout=60)
        with client.push_consumer(
            "follow-full", "s", "exclusive", initial_position="earliest", receiver_queue_size=5
        ) as pc:
            # Nothing is received: the subscription fills its read-ahead and the feed pauses. The
            # broker then stops fetching once the socket buffers fill, and must stay stopped past
            # the hung-broker timeout (a paused follower expects no answers).
            deadline = time.monotonic() + 60
            stable_since, last = time.monotonic(), fetches_served(cluster)
            while time.monotonic() - stable_since < HUNG_AFTER_S + 2:
                assert time.monotonic() < deadline, "the broker never stopped fetching for the feed"
                time.sleep(0.5)
                now = fetches_served(cluster)
                if now != last:
                    stable_since, last = time.monotonic(), now
            assert last * 1024 * 1024 < n * size, "the broker fetched everything: nothing paused"
            # Nor did the feed give up on the silent broker and start over.
            assert "fetch follow-full/0" not in cluster.dispatcher.log()

            # Room again: the feed goes on from where it stopped, nothing lost or repeated.
            got = drain(pc, n, timeout=120)
            assert [int(m.value[:6]) for m in got] == list(range(n))
            assert nothing_more(pc)


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
def test_a_paused_follower_hands_over_no_answer_until_resumed(
    cluster: PushCluster, client: Client, event_loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FetchFollower on its own against a real broker, on either event loop a service may run:
    pausing inside the answer callback stops the answers at once, even those already read in the
    same socket read, and resuming goes on with the next one, in order."""
    monkeypatch.setenv(EVENT_LOOP_ENV, event_loop)
    topic = f"follow-paused-{event_loop}"
    client.admin.create_topic(topic, partitions=1)
    n = 12
    with client.producer(topic, linger=0) as producer:
        for i in range(n):  # one batch each: with max_bytes=1 every answer holds one batch
            producer.send(b"%d" % i).result(timeout=20)
    leader = client.metadata(refresh=True).leader(topic, 0)
    assert leader is not None
    assert leader.wire_address is not None
    wire = leader.wire_address

    async def follow() -> None:
        answers: list[broker_pb2.FetchPartitionResponse] = []
        errors: list[Exception] = []
        follower: FetchFollower | None = None

        def on_answer(resp: broker_pb2.FetchResponse) -> None:
            assert follower is not None
            part = resp.partitions[0]
            if part.records:
                answers.append(part)
                follower.pause()

        request = broker_pb2.FetchRequest(
            max_wait_ms=200,
            min_bytes=1,
            max_bytes=1,
            session_epoch=-1,
            partitions=[broker_pb2.FetchPartition(topic=topic, partition=0, partition_max_bytes=1)],
        )
        follower = FetchFollower(wire, request, on_answer, errors.append, timeout_s=5, client_id="test")
        await follower.open()
        try:
            # The broker answers all n batches back to back while the follower holds still.
            for expected in range(1, n + 1):
                deadline = asyncio.get_running_loop().time() + 10
                while len(answers) < expected:
                    assert asyncio.get_running_loop().time() < deadline, f"answer {expected} never came"
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.3)  # time enough for more answers to slip through
                assert len(answers) == expected, "an answer arrived while paused"
                assert follower.paused
                follower.resume()
            assert [a.next_offset for a in answers] == list(range(1, n + 1))
            assert not errors
        finally:
            follower.close()

        # Nothing listens on a free port: the failure is raised by open(), typed.
        nowhere = FetchFollower(
            f"127.0.0.1:{free_port()}", broker_pb2.FetchRequest(), on_answer, errors.append, 5
        )
        with pytest.raises(BrokerNotAvailable):
            await nowhere.open()
        assert not errors

    event_loop_runner()(follow())
