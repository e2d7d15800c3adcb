"""kill -9 of the dispatcher mid-stream: the consumer reconnects by itself and loses nothing."""

from __future__ import annotations

import threading
import time
import urllib.request

from sluice import Client
from tests.integration.push.conftest import PushCluster
from tests.integration.push.helpers import eventually, nothing_more, produce


def cursors_clean(cluster: PushCluster) -> bool:
    """No durable cursor of the dispatcher has unpersisted changes (its metrics say)."""
    with urllib.request.urlopen(f"http://{cluster.dispatcher.metrics}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    dirty = [line for line in text.splitlines() if line.startswith("sluice_dispatcher_cursors_dirty{")]
    return all(float(line.rsplit(" ", 1)[1]) == 0 for line in dirty)


def test_dispatcher_kill_9_mid_stream(cluster: PushCluster, client: Client, topic: str) -> None:
    n = 400
    produce(client, topic, n, key=lambda i: b"k%d" % i)
    pc = client.push_consumer(topic, "rc", "shared", initial_position="earliest", receiver_queue_size=50)
    acked: set[int] = set()
    skipped: set[int] = set()
    after_kill: list[int] = []
    first_part = threading.Event()
    killed = threading.Event()
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            while len(acked) < n:
                msg = pc.receive(timeout=30)
                value = int(msg.value)
                if killed.is_set():
                    after_kill.append(value)
                elif value % 7 == 3:
                    skipped.add(value)  # "crashed while processing": left unacked, must come back
                    continue
                pc.ack(msg)
                acked.add(value)
                if len(acked) == 150:
                    first_part.set()
                    killed.wait(20)  # hold still while the dispatcher dies and comes back
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=consume)
    t.start()
    assert first_part.wait(20)
    acked_before = set(acked)
    time.sleep(0.2)  # the acks so far reach the dispatcher...
    eventually(lambda: cursors_clean(cluster), what="acks persisted")  # ...and its durable cursor
    cluster.restart_dispatcher(kill=True)
    killed.set()
    t.join(60)
    assert not errors, errors
    assert acked == set(range(n))  # nothing unacked was lost
    assert skipped
    assert skipped <= set(after_kill)
    assert not set(after_kill) & acked_before  # nothing acked (and flushed) came back
    stats = pc.stats()
    # It reconnected: the same stream again, or new streams for a routing that changed meanwhile.
    assert stats.streams[0].reconnects + stats.reroutes >= 1
    assert stats.streams[0].state == "subscribed"
    assert nothing_more(pc, 0.3)
    pc.close()
