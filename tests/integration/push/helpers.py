"""Small helpers shared by the push-consumer tests."""

from __future__ import annotations

import time
from collections.abc import Callable

from sluice import Client
from sluice.client.push import Message, PushConsumer


def produce(client: Client, topic: str, n: int, key: Callable[[int], bytes | None] = lambda i: None) -> None:
    """``n`` records with values ``b"0"``, ``b"1"``, ... (and keys from ``key(i)``)."""
    with client.producer(topic, linger="1ms") as producer:
        futures = [producer.send(str(i).encode(), key=key(i)) for i in range(n)]
        producer.flush()
        for f in futures:
            f.result()


def drain(pc: PushConsumer, n: int, timeout: float = 20.0, ack: bool = True) -> list[Message]:
    """Receive (and ack) exactly ``n`` messages, failing after ``timeout`` seconds."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"only {len(got)} of {n} messages arrived"
        msg = pc.receive(timeout=remaining)
        got.append(msg)
        if ack:
            pc.ack(msg)
    return got


def nothing_more(pc: PushConsumer, wait: float = 0.5) -> bool:
    """True when no message arrives within ``wait`` seconds."""
    try:
        msg = pc.receive(timeout=wait)
    except TimeoutError:
        return True
    raise AssertionError(f"unexpected message {msg!r}")


def eventually(check: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Wait until ``check()`` holds (for state that other processes change; no event to wait on)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
