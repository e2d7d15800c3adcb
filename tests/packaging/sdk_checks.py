"""The SDK's checks, run by the interpreter of a slim ``pip install sluice`` (tests/packaging).

A script, not a pytest module: the slim venv has the SDK and nothing else, not pytest, not this
repository's test harness. ``python sdk_checks.py BOOTSTRAP`` runs every check against a running
cluster (``sluice up`` from a full install), prints ``ok <name>`` per check and exits non-zero at the
first failure. It also asserts that no server dependency was imported along the way.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable

from sluice import Client

SERVER_ONLY = ("redis", "prometheus_client", "kubernetes", "uvloop", "jwt", "cryptography")
CHECKS: list[Callable[[Client, str], None]] = []


def check(fn: Callable[[Client, str], None]) -> Callable[[Client, str], None]:
    CHECKS.append(fn)
    return fn


@check
def produce_and_fetch(client: Client, topic: str) -> None:
    producer = client.producer(topic)
    sent = [
        producer.send(
            f"v{i}".encode(),
            key=f"k{i}".encode(),
            tag="even" if i % 2 == 0 else "odd",
            headers={"n": str(i).encode()},
        )
        for i in range(20)
    ]
    metas = [f.result(timeout=60) for f in sent]
    producer.flush()
    producer.close()
    assert all(m.topic == topic for m in metas)
    fetcher = client.fetcher({(topic, p): 0 for p in range(2)}, filters={topic: "even"})
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < 10 and time.monotonic() < deadline:
        got += [r.value for r in fetcher.fetch()]
    fetcher.close()
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(0, 20, 2)), got


@check
def list_offsets_and_metadata(client: Client, topic: str) -> None:
    latest = client.list_offsets(topic, "latest")
    assert sum(latest.values()) == 20, latest
    meta = client.metadata([topic], refresh=True)
    assert len(meta.topics[topic].partitions) == 2


@check
def group_consume_and_commit(client: Client, topic: str) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = client.consumer(group, topic, auto_offset_reset="earliest", enable_auto_commit=False)
    values: list[bytes] = []
    deadline = time.monotonic() + 90
    while len(values) < 20 and time.monotonic() < deadline:
        values += [r.value for r in consumer.poll(timeout=1.0)]
    assert len(values) == 20, values
    committed = consumer.commit()
    assert sum(committed.values()) == 20, committed
    consumer.close()
    assert client.admin.describe_group(group).group == group


@check
def push_consume_and_ack(client: Client, topic: str) -> None:
    pc = client.push_consumer(topic, f"s-{uuid.uuid4().hex[:8]}", "shared", initial_position="earliest")
    seen: set[bytes] = set()
    deadline = time.monotonic() + 90
    while len(seen) < 20 and time.monotonic() < deadline:
        msg = pc.receive(timeout=5)
        seen.add(msg.value)
        pc.ack(msg)
    pc.close()
    assert len(seen) == 20, seen


@check
def admin_lists_topics(client: Client, topic: str) -> None:
    assert topic in {t.name for t in client.admin.list_topics()}


@check
def asyncio_client(client: Client, topic: str) -> None:
    """sluice.aio on the slim install: send, group consume with a commit, push consume with acks."""
    import asyncio

    from sluice import aio

    async def run() -> None:
        async with aio.Client(client.bootstrap, request_timeout=60) as ac:
            async with ac.producer(topic) as producer:
                meta = await producer.send(b"aio", partition=0)
            async with ac.consumer(f"g-{uuid.uuid4().hex[:8]}", topic, auto_offset_reset="earliest") as c:
                got = 0
                async for _ in c:
                    got += 1
                    if got == 21:
                        break
                assert sum((await c.commit()).values()) == 21
            sub = f"s-{uuid.uuid4().hex[:8]}"
            async with ac.push_consumer(topic, sub, "shared", initial_position="earliest") as pc:
                msg = await pc.receive(timeout=60)
                pc.ack(msg)
        assert meta.topic == topic

    asyncio.run(asyncio.wait_for(run(), 180))


def main(bootstrap: str) -> int:
    topic = f"slim-{uuid.uuid4().hex[:8]}"
    with Client(bootstrap, request_timeout=60) as client:
        client.admin.create_topic(topic, partitions=2)
        for fn in CHECKS:
            fn(client, topic)
            print(f"ok {fn.__name__}", flush=True)
    loaded = sorted(m for m in SERVER_ONLY if m in sys.modules)
    assert not loaded, f"the SDK imported server-only modules: {loaded}"
    print("ok no-server-imports", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
