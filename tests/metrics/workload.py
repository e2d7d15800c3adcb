"""A workload through the real SDK that makes every metric on the dashboards move.

`Workload.scenario()` runs the one-off events (errors of every service, a rebalance with a fenced member,
a blocked push consumer); `Workload.start()` then keeps producing and consuming in a background thread
(so every rate on the dashboards is non-zero while Prometheus is queried) until `stop()`.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from datetime import timedelta

import grpc

from sluice.client.client import Client
from sluice.client.consumer import Consumer
from sluice.client.producer import Producer
from sluice.client.push import PushConsumer
from sluice.errors import RequestTimedOut, SluiceError
from sluice.v1 import broker_pb2, broker_pb2_grpc, offset_store_pb2, offset_store_pb2_grpc

TOPIC = "metrics-orders"
#: Delayed sends go here (not to TOPIC, whose counts the other checks read): the scheduler's panels.
DELAYED_TOPIC = "metrics-reminders"
GROUP = "metrics-group"
SUBSCRIPTION = "metrics-sub"
BLOCKED_SUBSCRIPTION = "metrics-blocked"
PARTITIONS = 2
MAX_UNACKED = 4
#: Every n-th offset is nacked on every delivery: with max_redeliver=1 it is redelivered once, then
#: dead-lettered.
NACK_EVERY = 5


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text: str = response.read().decode()
        return text


def total(exposition: str, name: str, label: str = "") -> float:
    """The sum of a metric's samples (those carrying ``label="value"`` when given) in exposition text."""
    found = 0.0
    for line in exposition.splitlines():
        if line.startswith((name + "{", name + " ")) and label in line:
            found += float(line.rsplit(" ", 1)[1])
    return found


def wait_for(what: str, condition: Callable[[], bool], timeout: float, step: Callable[[], object]) -> None:
    """Run ``step`` until ``condition()`` holds. It reads another process's metrics: no event to wait on."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        step()


class Workload:
    def __init__(self, bootstrap: str, metrics: Mapping[str, str]) -> None:
        self.metrics = dict(metrics)  # service -> host:port of its /metrics
        self.client = Client(bootstrap)
        self.producer: Producer | None = None
        self.delayed: Producer | None = None
        self.consumers: list[Consumer] = []
        self.push: PushConsumer | None = None
        self.blocked: PushConsumer | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    # ---- one-off events ------------------------------------------------------------------------------------

    def scenario(self) -> None:
        admin = self.client.admin
        admin.create_topic(TOPIC, partitions=PARTITIONS)
        # Fast heartbeats, so the rebalance and the fencing below take a second, not several.
        admin.set_group_config(GROUP, heartbeat_interval="200ms")
        self.producer = self.client.producer(TOPIC, linger="5ms")
        admin.create_topic(DELAYED_TOPIC, partitions=1)
        self.delayed = self.client.producer(DELAYED_TOPIC, linger="5ms")
        self.produce(200)
        self.fetch_all(200)
        self.errors_of_every_service()
        self.rebalance_with_a_fenced_member()
        self.push = self.client.push_consumer(
            TOPIC,
            SUBSCRIPTION,
            "shared",
            initial_position="earliest",
            receiver_queue_size=20,
            max_redeliver=1,
            nack_delay="100ms",
        )
        self.blocked = self.client.push_consumer(
            TOPIC,
            BLOCKED_SUBSCRIPTION,
            "shared",
            initial_position="earliest",
            receiver_queue_size=10,
            max_unacked=MAX_UNACKED,
        )
        for _ in range(MAX_UNACKED):  # received and never acked: the consumer is blocked at max_unacked
            self.blocked.receive(timeout=10)

    def produce(self, count: int) -> None:
        assert self.producer is not None
        for i in range(count):
            self.producer.send(b"value-%d" % i, key=b"key-%d" % (i % 7), tag="a" if i % 2 else "b")
        self.producer.flush(10)

    def produce_delayed(self, count: int) -> None:
        """Records due 200 ms from now: the scheduler indexes, holds and delivers them (its lateness)."""
        assert self.delayed is not None
        for i in range(count):
            self.delayed.send(b"later-%d" % i, deliver_after=timedelta(milliseconds=200))

    def fetch_all(self, count: int) -> None:
        fetcher = self.client.fetcher({(TOPIC, p): 0 for p in range(PARTITIONS)}, max_wait_ms=100)
        try:
            got = 0
            deadline = time.monotonic() + 10
            while got < count and time.monotonic() < deadline:
                got += len(fetcher.fetch(timeout=1))
            assert got >= count, f"fetched {got} of {count} records"
        finally:
            fetcher.close()

    def errors_of_every_service(self) -> None:
        """One refused request per service, so every service's error series exists."""
        admin = self.client.admin
        expect_error(lambda: admin.create_topic(TOPIC, partitions=PARTITIONS))  # coordinator
        expect_error(
            lambda: self.client.describe_subscription(TOPIC, "metrics-no-such-subscription")
        )  # dispatcher
        md = self.client.metadata(refresh=True)
        broker = md.brokers[md.topics[TOPIC].partitions[0].broker_id]
        with grpc.insecure_channel(f"{broker.host}:{broker.port}") as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            expect_rpc_error(
                lambda: stub.Produce(broker_pb2.ProduceRequest(acks=1, timeout_ms=1000), timeout=10)
            )
        assert md.offset_store, "the stack has no offset store"
        with grpc.insecure_channel(md.offset_store) as channel:
            store = offset_store_pb2_grpc.OffsetStoreStub(channel)
            expect_rpc_error(
                lambda: store.FetchOffsets(offset_store_pb2.FetchOffsetsRequest(group=""), timeout=10)
            )

    def rebalance_with_a_fenced_member(self) -> None:
        """Member A owns both partitions; B joins; A does not poll, so it keeps the partition it must
        release past the rebalance timeout and the coordinator fences it. A then rejoins."""
        # The member's own rebalance timeout (the group sets none, so the member's applies).
        first = self.client.consumer(
            GROUP,
            TOPIC,
            auto_offset_reset="earliest",
            auto_commit_interval="500ms",
            max_poll_records=50,
            rebalance_timeout="1s",
        )
        self.consumers.append(first)
        wait_for("member A to own every partition", lambda: len(first.assignment()) == PARTITIONS, 15,
                 lambda: first.poll(0.1))  # fmt: skip
        first.poll(0.1)  # what the previous poll returned is processed now
        first.commit()
        # The baseline comes first: on a loaded machine B's join can take longer than A's timeout.
        coordinator = self.metrics["coordinator"]
        fenced = total(scrape(coordinator), "sluice_coordinator_fenced_members_total")
        second = self.client.consumer(
            GROUP, TOPIC, auto_offset_reset="earliest", auto_commit_interval="500ms", max_poll_records=50
        )
        self.consumers.append(second)
        wait_for("the coordinator to fence member A",
                 lambda: total(scrape(coordinator), "sluice_coordinator_fenced_members_total") > fenced, 20,
                 lambda: second.poll(0.1))  # fmt: skip

    def join_and_leave(self) -> None:
        """A third member joins and, once the group has settled with it, leaves: two more rebalances,
        while the steady traffic (and the scrapes) run."""
        coordinator = self.metrics["coordinator"]
        name, group = "sluice_coordinator_rebalance_duration_seconds_count", f'group="{GROUP}"'
        settled = total(scrape(coordinator), name, group)
        extra = self.client.consumer(GROUP, TOPIC, auto_offset_reset="earliest", max_poll_records=50)
        try:
            wait_for("the group to settle with a third member",
                     lambda: total(scrape(coordinator), name, group) > settled, 20,
                     lambda: extra.poll(0.1))  # fmt: skip
        finally:
            extra.close()

    # ---- steady traffic ------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="metrics-workload", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self.push is not None
        try:
            n = 0
            while not self._stop.is_set():
                self.produce(10)
                self.produce_delayed(2)
                n += 1
                if n % 5 == 0:  # now and then, what an operator's tools do: fetch, describe
                    self.fetch_all(1)
                    self.client.describe_subscription(TOPIC, SUBSCRIPTION)
                    self.client.admin.describe_group(GROUP)
                for consumer in self.consumers:
                    consumer.poll(0.02, max_records=20)
                self._drain_push(0.02)
        except BaseException as exc:  # reported by stop(): a failed workload fails the test
            self.error = exc

    def _drain_push(self, timeout: float) -> None:
        assert self.push is not None
        for _ in range(100):
            try:
                message = self.push.receive(timeout=timeout)
            except RequestTimedOut:
                return
            if message.offset % NACK_EVERY == 0:
                self.push.nack(message)
            else:
                self.push.ack(message)

    def wait_for_dead_letters(self, timeout: float = 30) -> None:
        dispatcher = self.metrics["dispatcher"]

        def dead_lettered() -> bool:
            text = scrape(dispatcher)
            return total(text, "sluice_dispatcher_dlq_messages_total", f'subscription="{SUBSCRIPTION}"') > 0

        wait_for("messages in the dead-letter topic", dead_lettered, timeout, self._check_running)

    def _check_running(self) -> None:
        if self.error is not None:
            raise self.error
        self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        try:
            self.client.close(timeout=10)
        finally:
            if self.error is not None:
                raise self.error


def expect_error(call: Callable[[], object]) -> None:
    try:
        call()
    except SluiceError:
        return
    raise AssertionError("the request was expected to fail")


def expect_rpc_error(call: Callable[[], object]) -> None:
    try:
        call()
    except grpc.RpcError:
        return
    raise AssertionError("the RPC was expected to fail")
