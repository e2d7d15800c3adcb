"""The parked keys while a restarted dispatcher loads a subscription's parking store (docs/poison-keys.md,
"Operators"), against real processes: coordinator, broker, offset store and dispatcher.

The store is a long ``.PARK`` log with no snapshot (written here directly: 40,000 messages parked and
resolved, then 5 of key ``p`` still parked, held), so the load replays every event and takes a
measurable time. A consumer coming back starts the load; asked during it:

- ``list_parked_keys`` answers the whole state once the load is done (before: an empty list, the
  subscription loaded but its parking not restored yet), and with a deadline shorter than the load,
  ``ParkStoreLoading``;
- ``unpark_key`` releases the key once the load is done (before: "not parked").

And the listing from the store (no consumer back) asked from the moment the dispatcher process is up, before
its first metadata refresh: it lists the key (before: nothing, the partitions it serves taken from the
empty view it starts with; a race, which the test's first calls lose about every other run).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sluice import Client
from sluice.client.push import Message
from sluice.common.rpc import call
from sluice.dispatcher.parkstore import SNAPSHOT_ENV
from sluice.errors import ParkStoreLoading
from sluice.retry.parkbook import H_HOW, H_OP, H_PCOUNT, H_PDUE, H_PSOURCE
from sluice.v1 import dispatcher_pb2, dispatcher_pb2_grpc
from tests.harness import start_service
from tests.integration.parking.test_park_store import wait_for
from tests.integration.parking.test_park_store_recovery import RESTORED, restart_with
from tests.integration.push.conftest import PushCluster, run_push_cluster, wait_for_dispatcher

KEY = b"p"
RESOLVED = 40_000
PARKED = 5
SETTINGS: dict[str, Any] = {"max_redeliver": 1, "park_after": 1, "park_hold": True, "nack_delay": "20ms"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[PushCluster]:
    with run_push_cluster() as c:
        yield c


def build_store(client: Client, topic: str, resolved: int = RESOLVED) -> None:
    """``topic`` with ``PARKED`` records of ``KEY``, and a store holding them parked (count 3: past
    ``max_redeliver``, so held at once) after ``RESOLVED`` parked-and-resolved messages of another key."""
    client.admin.create_topic(topic, partitions=1)
    with client.producer(topic, linger="1ms") as producer:
        for i in range(PARKED):
            producer.send(str(i).encode(), key=KEY)
        producer.flush()
    park = f"{topic}.s.PARK"
    client.admin.create_topic(park, partitions=1)
    with client.producer(park, linger="20ms") as producer:
        for i in range(resolved):  # replayed at every load, then forgotten
            src = f"{topic}/0/{PARKED + i}".encode()
            producer.send(b"v" * 100, key=b"k", headers={H_OP: b"park", H_PSOURCE: src})
            producer.send(b"", key=b"k", headers={H_OP: b"resolved", H_PSOURCE: src, H_HOW: b"ok"})
        for i in range(PARKED):
            src = f"{topic}/0/{i}".encode()
            producer.send(
                str(i).encode(),
                key=KEY,
                headers={H_OP: b"park", H_PSOURCE: src, H_PCOUNT: b"3", H_PDUE: b"0"},
            )
        producer.flush()


def during_the_load(cluster: PushCluster, client: Client, topic: str, ask: Any) -> tuple[Any, list[Message]]:
    """Start a consumer (its subscribe loads the store), call ``ask()`` once the dispatcher says the load
    began and has not said it ended; returns what it answered and what the consumer received by then."""
    got: list[Message] = []
    subscribed = threading.Event()
    stop = threading.Event()
    errors: list[BaseException] = []

    def consumer() -> None:
        try:
            with client.push_consumer(
                topic, "s", "key_shared", consumer_id="c", initial_position="earliest", **SETTINGS
            ) as pc:
                subscribed.set()
                deadline = time.monotonic() + 60
                while not stop.is_set() and time.monotonic() < deadline:
                    try:
                        m = pc.receive(timeout=0.1)
                    except TimeoutError:
                        continue
                    got.append(m)
                    pc.ack(m)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
            subscribed.set()

    loads = cluster.dispatcher.log().count("loading the parking store")
    restored = len(RESTORED.findall(cluster.dispatcher.log()))
    t = threading.Thread(target=consumer, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while cluster.dispatcher.log().count("loading the parking store") == loads:
            assert time.monotonic() < deadline, "the load never began"
            assert not errors, errors
            time.sleep(0.005)
        # The call is made while the load runs (it has not logged its end): this test shows something
        # only then. A load too quick for it needs a longer store.
        assert len(RESTORED.findall(cluster.dispatcher.log())) == restored, "the load was over already"
        answer = ask()
        assert subscribed.wait(30)
        time.sleep(1.0)  # what the consumer receives once the answer is applied
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors
    return answer, got


def test_parked_keys_asked_during_the_store_load_are_answered_once_it_is_done(
    cluster: PushCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = f"pload-{uuid.uuid4().hex[:6]}"
    with Client(cluster.bootstrap, request_timeout=20) as client:
        build_store(client, topic)
        # No snapshot (it would make the next load short): each load replays the whole log.
        restart_with(cluster, monkeypatch, **{SNAPSHOT_ENV: str(10**9)})
        stub = client._channels.stub(cluster.dispatcher.address, dispatcher_pb2_grpc.DispatcherStub)
        request = dispatcher_pb2.ListParkedKeysRequest(topic=topic, subscription="s")

        def ask() -> list[tuple[bytes, str, int, int]]:
            # A deadline shorter than the load: the typed, retriable error, not a partial list.
            with pytest.raises(ParkStoreLoading) as refused:
                call(stub.ListParkedKeys, request, 0.4)
            assert refused.value.retriable
            return [
                (k.key, k.state, k.head_offset, k.waiting) for k in client.admin.list_parked_keys(topic, "s")
            ]

        listed, got = during_the_load(cluster, client, topic, ask)
        assert listed == [(KEY, "held", 0, PARKED - 1)], (
            "the first listing after the restart is the whole state"
        )
        assert got == [], "held: nothing of the key delivered"
        m = RESTORED.findall(cluster.dispatcher.log())[-1]
        assert (m[0], int(m[2])) == ("1", 2 * RESOLVED + PARKED), m  # the whole log, one key parked

        restart_with(cluster, monkeypatch, **{SNAPSHOT_ENV: str(10**9)})
        released, got = during_the_load(
            cluster, client, topic, lambda: client.admin.unpark_key(topic, "s", KEY)
        )
        assert released == PARKED
        assert [int(m.value) for m in got] == list(range(PARKED)), "released in order, once"
        assert [m.redelivery_count for m in got] == [0] * PARKED


def test_listed_from_the_store_as_soon_as_the_dispatcher_answers(cluster: PushCluster) -> None:
    topic = f"pfirst-{uuid.uuid4().hex[:6]}"
    with Client(cluster.bootstrap, request_timeout=20) as client:
        build_store(client, topic, resolved=10)
        cluster.dispatcher.kill()
        cluster.dispatcher = start_service("dispatcher", *cluster.dispatcher.args)
        # Straight to the new process, from the moment it listens (the SDK asks it only once the
        # coordinator lists it) until it registered and read the cluster's metadata a few times.
        stub = client._channels.stub(cluster.dispatcher.address, dispatcher_pb2_grpc.DispatcherStub)
        request = dispatcher_pb2.ListParkedKeysRequest(topic=topic, subscription="s")
        answers = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            keys = stub.ListParkedKeys(request, timeout=20).keys
            answers.append([(k.key, k.state, k.head_offset, k.waiting) for k in keys])
        wait_for_dispatcher(cluster.bootstrap, cluster.dispatcher.address)
        want = [(KEY, "stored", 0, PARKED - 1)]
        assert [a for a in answers if a != want] == [], f"{len(answers)} answers"


def test_unpark_of_a_subscription_not_loaded_is_kept_in_the_store(
    cluster: PushCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No consumer back after the restart: the unpark goes to the store, and the load that follows
    tries the key again (held without it, the first test shows)."""
    topic = f"punpark-{uuid.uuid4().hex[:6]}"
    with Client(cluster.bootstrap, request_timeout=20) as client:
        build_store(client, topic, resolved=10)
        restart_with(cluster, monkeypatch)
        keys = client.admin.list_parked_keys(topic, "s")
        assert [(k.key, k.state, k.waiting) for k in keys] == [(KEY, "stored", PARKED - 1)]
        assert client.admin.unpark_key(topic, "s", KEY) == PARKED
        with client.push_consumer(
            topic, "s", "key_shared", consumer_id="c", initial_position="earliest", **SETTINGS
        ) as pc:
            got = []
            for _ in range(PARKED):
                m = pc.receive(timeout=10)
                got.append(m)
                pc.ack(m)
            assert [int(m.value) for m in got] == list(range(PARKED)), "released in order"
            assert [m.redelivery_count for m in got] == [0] * PARKED
            wait_for("the key released", lambda: not client.admin.list_parked_keys(topic, "s"))
