"""The poison-key workload, shared by ``test_poison_keys.py`` (short) and ``bench/poison_keys.py`` (long).

A Key_Shared subscription over records with ``KEYS`` distinct keys. In the poison topic one key,
``POISON``, carries ``poison_share`` of the records and every one of its messages fails (the consumer
nacks it); the baseline topic holds exactly the same good records without the poison key. Consumers
(SDK push consumers, one thread each) join and leave as the run progresses: a third joins at a third
of the good records, the first leaves at two thirds (what it holds goes back). The figure is the
good keys' throughput: good records / seconds from the first subscribe to the last good record's
first acknowledgement.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from sluice import Client
from sluice.client.push import Message, PushConsumer

POISON = b"poison"
KEYS = 1000


def good_key(i: int) -> bytes:
    return f"k{i % (KEYS - 1)}".encode()


def is_poison(i: int, share_pct: int) -> bool:
    """Record ``i`` of the poison topic belongs to the poison key (``share_pct`` in 100, spread out)."""
    return (i * share_pct) % 100 < share_pct


def produce(
    client: Client, topic: str, n: int, share_pct: int, with_poison: bool
) -> tuple[list[int], list[int]]:
    """Values are record numbers (``str(i)``); the baseline leaves the poison records out (same good
    numbers, same keys). Returns (good numbers, poison numbers)."""
    good: list[int] = []
    poison: list[int] = []
    with client.producer(topic, linger="5ms") as producer:
        futures = []
        for i in range(n):
            if is_poison(i, share_pct):
                poison.append(i)
                if with_poison:
                    futures.append(producer.send(str(i).encode(), key=POISON))
            else:
                good.append(i)
                futures.append(producer.send(str(i).encode(), key=good_key(i)))
        producer.flush()
        for f in futures:
            f.result()
    return good, poison


@dataclass
class Outcome:
    poisoned: bool
    seconds: float
    good: int
    #: Good records delivered more than once (at-least-once redelivery after a consumer left).
    good_duplicates: int
    poison_deliveries: int = 0
    dlq: list[int] = field(default_factory=list)
    #: The most waiting messages seen behind one parked key, and the parked states seen.
    max_waiting: int = 0
    states: set[str] = field(default_factory=set)

    @property
    def rate(self) -> float:
        return self.good / self.seconds


@dataclass
class Settings:
    park_after: int = 1
    max_redeliver: int = 2
    park_max_messages: int = 50
    nack_delay: str = "100ms"
    receiver_queue_size: int = 500
    timeout: float = 60.0


def run(
    client: Client,
    topic: str,
    good: list[int],
    poison: list[int],
    poisoned: bool,
    s: Settings,
    on_done: Callable[[], None] | None = None,
) -> Outcome:
    """Consume one fresh subscription of ``topic`` until every good record was acknowledged (and, when
    ``poisoned``, every poison record reached the DLQ); count everything. Not ``poisoned`` on a topic
    with the poison key: its records succeed like the others (the "same traffic, nothing failing"
    baseline). ``on_done`` is called once every good record was acknowledged (the benchmark reads
    the processes' CPU there, before the DLQ is read back)."""
    sub = f"ks-{uuid.uuid4().hex[:6]}"
    good_set = set(good)
    seen: Counter[int] = Counter()
    first_done = threading.Event()
    lock = threading.Lock()
    poison_deliveries = 0

    def consume(pc: PushConsumer, until: threading.Event) -> None:
        nonlocal poison_deliveries
        while not until.is_set():
            try:
                msgs = [pc.receive(timeout=0.1)]
            except TimeoutError:
                continue
            for m in msgs:
                _handle(pc, m)

    def _handle(pc: PushConsumer, m: Message) -> None:
        nonlocal poison_deliveries
        if m.key == POISON:
            with lock:
                poison_deliveries += 1
            (pc.nack if poisoned else pc.ack)(m)
            return
        v = int(m.value)
        pc.ack(m)
        with lock:
            seen[v] += 1
            if len(seen) == len(good_set):
                first_done.set()

    def start(name: str) -> tuple[PushConsumer, threading.Event, threading.Thread]:
        pc = client.push_consumer(
            topic,
            sub,
            "key_shared",
            consumer_name=name,
            initial_position="earliest",
            receiver_queue_size=s.receiver_queue_size,
            nack_delay=s.nack_delay,
            max_redeliver=s.max_redeliver,
            park_after=s.park_after,
            park_max_messages=s.park_max_messages,
        )
        until = threading.Event()
        t = threading.Thread(target=consume, args=(pc, until), daemon=True)
        t.start()
        return pc, until, t

    if poisoned:
        # The DLQ topic is made on the first dead letter otherwise: a one-off cost (coordinator, broker,
        # metadata) that a run of a few seconds would count against the poisoned side.
        client.admin.create_topic(f"{topic}.{sub}.DLQ", partitions=1)
    t0 = time.monotonic()
    consumers = [start("c1"), start("c2")]
    out = Outcome(poisoned, 0.0, len(good_set), 0)
    joined = left = False
    next_watch = t0
    deadline = t0 + s.timeout
    while not first_done.wait(0.02):
        assert time.monotonic() < deadline, f"only {len(seen)} of {len(good_set)} good records acknowledged"
        with lock:
            done = len(seen)
        if not joined and done >= len(good_set) // 3:
            consumers.append(start("c3"))
            joined = True
        if joined and not left and done >= 2 * len(good_set) // 3:
            pc, until, t = consumers.pop(0)
            until.set()
            t.join()
            pc.close()  # what it held unacknowledged goes back to the others
            left = True
        if time.monotonic() >= next_watch:  # in both modes alike, so it costs both the same
            _watch_parked(client, topic, sub, out)
            next_watch = time.monotonic() + 0.1
    out.seconds = time.monotonic() - t0
    if on_done is not None:
        on_done()
    if poisoned:
        out.dlq = _read_dlq(client, f"{topic}.{sub}.DLQ", len(poison), deadline)
    for pc, until, t in consumers:
        until.set()
        t.join()
        pc.close()
    out.good_duplicates = sum(n - 1 for n in seen.values())
    out.poison_deliveries = poison_deliveries
    assert set(seen) == good_set
    return out


def _watch_parked(client: Client, topic: str, sub: str, out: Outcome) -> None:
    for k in client.admin.list_parked_keys(topic, sub):
        out.max_waiting = max(out.max_waiting, k.waiting)
        out.states.add(k.state)


def _read_dlq(client: Client, dlq: str, n: int, deadline: float) -> list[int]:
    """The DLQ's values in log order, once it holds ``n`` records (duplicates kept)."""
    while True:
        if any(t.name == dlq for t in client.admin.list_topics()):
            break
        assert time.monotonic() < deadline, f"no DLQ topic {dlq}"
        time.sleep(0.05)
    got: list[int] = []
    with client.push_consumer(dlq, "check", "exclusive", initial_position="earliest") as pc:
        while len(set(got)) < n:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"only {len(set(got))} of {n} poison records in the DLQ"
            try:
                m = pc.receive(timeout=min(remaining, 1.0))
            except TimeoutError:
                continue
            got.append(int(m.value))
            pc.ack(m)
    return got


def check_dlq(dlq: list[int], poison: list[int]) -> int:
    """The poison key's records, each in the DLQ, in order; returns the duplicates (at least once)."""
    firsts: list[int] = []
    known: set[int] = set()
    for v in dlq:
        if v not in known:
            known.add(v)
            firsts.append(v)
    assert firsts == poison, "poison records missing from the DLQ or out of order"
    return len(dlq) - len(firsts)
