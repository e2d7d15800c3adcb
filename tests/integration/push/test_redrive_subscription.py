"""sluice dlq redrive --subscription: exactly once at subscription S across kill -9 (one between a write's
acknowledgement and the cursor save), another subscription of the topic sees none, ``--to original``,
a redriven record that fails again returns to the same DLQ, list, peek, purge, and the subscription's own
consumer of the topic receiving its redriven records (``redrive=True``) (docs/retry.md)."""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections import Counter
from pathlib import Path

from sluice import Client, aio
from sluice.cli.dlq_redrive import CRASH_ENV
from sluice.client.push import Message, PushConsumer, dlq_topic
from sluice.errors import UnknownTopicOrPartition
from sluice.retry.levels import H_DLQ_SOURCE, H_OFFSET, H_PARTITION, H_REDRIVE_COUNT, H_TOPIC, redrive_topic
from tests.integration.push.conftest import PushCluster
from tests.integration.push.helpers import drain, eventually, nothing_more
from tests.integration.retry.test_redrive import dlq_process, dlq_run

ROOT = Path(__file__).resolve().parents[3]
RECORDS = 3_000
OVER_CAP = 20


def _ends(client: Client, topic: str) -> dict[int, int]:
    """The topic's end offsets; {} before the dispatcher created it."""
    try:
        return client.list_offsets(topic, "latest")
    except UnknownTopicOrPartition:
        client.metadata(refresh=True)
        return {}


def _rest(pc: PushConsumer, quiet: float) -> list[Message]:
    """What else arrives (acked) until nothing has for ``quiet`` seconds (at most 30 s in all)."""
    out: list[Message] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            out.append(pc.receive(timeout=quiet))
        except TimeoutError:
            break
        pc.ack(out[-1])
    return out


def _dead_letter_one(client: Client, topic: str, sub: str) -> None:
    """Produce one record to ``topic`` and fail it at ``sub`` until the dispatcher dead-letters it."""
    with client.producer(topic) as p:
        p.send(b"poison", key=b"k").result(10)
    with client.push_consumer(
        topic, sub, "shared", initial_position="earliest", nack_delay="50ms", max_redeliver=1
    ) as pc:
        for _ in range(2):  # the first delivery and one redelivery, then the DLQ
            pc.nack(pc.receive(timeout=10))
        eventually(lambda: _ends(client, dlq_topic(topic, sub)) == {0: 1}, what="dead letter")


def test_subscription_redrive_exactly_once_across_kills(cluster: PushCluster, client: Client) -> None:
    topic, sub = f"rdv-{os.getpid()}-{time.monotonic_ns() % 10**6}", "s"
    client.admin.create_topic(topic, partitions=1)
    other = client.push_consumer(topic, "other", "shared", initial_position="earliest")
    try:
        _dead_letter_one(client, topic, sub)
        (seen,) = drain(other, 1)
        assert seen.value == b"poison"
        dlq = dlq_topic(topic, sub)
        with client.producer(dlq) as p:  # a DLQ as many failures would leave it (failing 3,000 is slow)
            for i in range(RECORDS + OVER_CAP):
                headers = {H_TOPIC: topic.encode(), H_PARTITION: b"0", H_OFFSET: str(i + 1).encode()}
                if i >= RECORDS:
                    headers[H_REDRIVE_COUNT] = b"3"  # redriven 3 times already: stays
                p.send(f"v{i}".encode(), headers=headers, partition=0)
            p.flush()
        args = ("redrive", "--subscription", sub, "--topic", topic)

        # 1. Killed between the acknowledgement of the 2nd batch (1,000 records) and its cursor save.
        code, _, err = dlq_run(cluster, *args, env={CRASH_ENV: "1000"})
        assert code == -9, err[-2000:]
        assert client.list_offsets(redrive_topic(topic, sub), "latest") == {0: 1000}

        # 2. Throttled, killed from outside mid-way.
        proc = dlq_process(cluster, *args, "--rate", "1000/s")
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stderr.readline().decode()
            m = re.search(r"read (\d+)/", line)
            if m and int(m.group(1)) >= 500:
                break
            assert line or proc.poll() is None, "the redrive ended before it could be killed"
        proc.kill()
        proc.communicate(timeout=10)

        # 3. To the end.
        code, out, err = dlq_run(cluster, *args)
        assert code == 0, err[-2000:]
        code, out, _ = dlq_run(cluster, *args)
        assert (code, "redrove 0 of 0" in out) == (0, True), "the cursor is at the end"

        # Subscription S, reading its redrive topic, gets each record exactly once.
        expected = {b"poison"} | {f"v{i}".encode() for i in range(RECORDS)}
        with client.push_consumer(
            redrive_topic(topic, sub), sub, "shared", initial_position="earliest"
        ) as pc:
            got = drain(pc, len(expected), timeout=60)
            got += _rest(pc, 1.0)
        values = Counter(m.value for m in got)
        twice = {v: n for v, n in values.items() if n > 1}
        assert twice == {}, f"{len(twice)} records arrived more than once"
        assert set(values) == expected, "every record under the cap arrived, the capped ones did not"
        first = next(m for m in got if m.value == b"poison")
        assert first.headers[H_REDRIVE_COUNT] == b"1"
        assert first.headers[H_DLQ_SOURCE] == f"{dlq}/0/0".encode()
        assert (first.headers[H_TOPIC], first.headers[H_OFFSET], first.key) == (topic.encode(), b"0", b"k")
        # The other subscription of the topic saw none of them: the topic holds its one record.
        assert nothing_more(other, 0.5)
        assert client.list_offsets(topic, "latest") == {0: 1}
    finally:
        other.close()


def test_subscription_redrive_original_again_list_peek_purge(cluster: PushCluster, client: Client) -> None:
    topic, sub = f"rdo-{os.getpid()}-{time.monotonic_ns() % 10**6}", "s"
    client.admin.create_topic(topic, partitions=2)
    _dead_letter_one(client, topic, sub)
    dlq = dlq_topic(topic, sub)
    args = ("--subscription", sub, "--topic", topic)

    # Refusals decided before any connection: tests/unit/cli/test_cli_dlq_args.py.
    code, out, _ = dlq_run(cluster, "list")
    assert dlq in out
    code, out, _ = dlq_run(cluster, "peek", *args)
    assert (code, f"from {topic}[" in out) == (0, True)

    # Redriven to S, failing again: back in the same DLQ, with its redrive count and first origin.
    code, _, err = dlq_run(cluster, "redrive", *args)
    assert code == 0, err
    with client.push_consumer(
        redrive_topic(topic, sub),
        sub,
        "shared",
        initial_position="earliest",
        nack_delay="50ms",
        max_redeliver=1,
    ) as pc:
        for _ in range(2):
            pc.nack(pc.receive(timeout=10))
        eventually(lambda: client.list_offsets(dlq, "latest") == {0: 2}, what="the second dead letter")
    with client.push_consumer(dlq, "reader", "exclusive", initial_position="earliest") as reader:
        again = drain(reader, 2)[1]
    assert again.headers[H_REDRIVE_COUNT] == b"1"
    assert again.headers[H_TOPIC] == topic.encode()

    # --to original, confirmed: the one not yet redriven goes back to its partition of the topic (every
    # subscription sees it); the first, at the cursor already, is not moved again.
    before = client.list_offsets(topic, "latest")
    code, out, err = dlq_run(cluster, "redrive", *args, "--to", "original", "--yes")
    assert code == 0, err
    assert "redrove 1 of 1" in out
    after = client.list_offsets(topic, "latest")
    assert sum(after.values()) - sum(before.values()) == 1
    assert after[int(again.headers[H_PARTITION])] == before[int(again.headers[H_PARTITION])] + 1

    code, _, err = dlq_run(cluster, "purge", *args, "--yes")
    assert code == 0, err
    assert client.list_offsets(dlq, "latest") == {0: 0}


def test_subscription_consumer_receives_its_redrive(cluster: PushCluster, client: Client) -> None:
    """The ONE consumer of T/s, open before the redrive topic existed, gets the records redriven with
    the CLI exactly once (it finds the topic at its next check), from the same receive_many, and its
    acks reach the redrive topic's subscription; another subscription of T sees none. A consumer
    started after the topic exists (aio) reads it from the start: only what was redriven since."""
    topic, sub, n = f"rdc-{os.getpid()}-{time.monotonic_ns() % 10**6}", "s", 20
    client.admin.create_topic(topic, partitions=2)
    other = client.push_consumer(topic, "other", "shared", initial_position="earliest")
    pc = client.push_consumer(
        topic,
        sub,
        "shared",
        initial_position="earliest",
        nack_delay="50ms",
        max_redeliver=1,
        redrive_check_interval="200ms",
    )
    try:
        with client.producer(topic) as p:
            for i in range(n):
                p.send(f"p{i}".encode(), key=str(i).encode())
        deliveries: Counter[bytes] = Counter()
        deadline = time.monotonic() + 30
        while sum(deliveries.values()) < 2 * n and time.monotonic() < deadline:
            for m in pc.receive_many(100, timeout=1.0):  # the first delivery and one redelivery: DLQ
                deliveries[m.value] += 1
                pc.nack(m)
        assert deliveries == Counter({f"p{i}".encode(): 2 for i in range(n)})
        dlq = dlq_topic(topic, sub)
        eventually(lambda: _ends(client, dlq) == {0: n}, what="the dead letters")
        assert len(drain(other, n)) == n
        assert nothing_more(other, 0.3)
        assert {s.topic for s in pc.stats().streams} == {topic}, "no redrive topic yet"

        code, out, err = dlq_run(cluster, "redrive", "--subscription", sub, "--topic", topic)
        assert code == 0, err[-2000:]
        assert f"redrove {n} of {n}" in out, out

        got: list[Message] = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            msgs = pc.receive_many(100, timeout=1.0)
            pc.ack_many(msgs)
            got += msgs
        got += _rest(pc, 1.0)
        values = Counter(m.value for m in got)
        assert values == Counter(f"p{i}".encode() for i in range(n)), "each redriven record exactly once"
        assert {m.topic for m in got} == {redrive_topic(topic, sub)}
        assert {s.topic for s in pc.stats().streams} == {topic, redrive_topic(topic, sub)}
        assert all(m.headers[H_REDRIVE_COUNT] == b"1" for m in got)
        assert nothing_more(other, 0.5), "another subscription of the topic sees none"
        assert sum(client.list_offsets(topic, "latest").values()) == n, "the topic was not written"
    finally:
        pc.close()
        other.close()

    # One more dead letter redriven: a consumer started now gets it and not the 20 acked above.
    with client.producer(dlq) as p:
        p.send(b"late", headers={H_TOPIC: topic.encode(), H_PARTITION: b"0", H_OFFSET: b"99"}, partition=0)
    code, out, err = dlq_run(cluster, "redrive", "--subscription", sub, "--topic", topic)
    assert (code, "redrove 1 of 1" in out) == (0, True), err[-2000:]

    async def main() -> list[bytes]:
        async with (
            aio.Client(cluster.bootstrap, request_timeout=10) as ac,
            ac.push_consumer(topic, sub, "shared") as apc,
        ):
            msgs = await apc.receive_many(100, timeout=20)
            apc.ack_many(msgs)
            msgs += await apc.receive_many(100, timeout=1.0)
            apc.ack_many(msgs)
            return [m.value for m in msgs]

    assert asyncio.run(main()) == [b"late"]
