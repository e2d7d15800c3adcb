"""The sync SDK's iterators against a real stack: ``for record in consumer`` and ``for msg in
push_consumer`` yield as records arrive and stop when the consumer is closed from another thread; a commit
inside the loop covers the records reached, never later ones."""

from __future__ import annotations

import threading
import time

from sluice import Client
from sluice.client.push import Message
from sluice.codec.batch import Record
from tests.integration.aio.conftest import FAST, Stack, name


def test_for_record_in_consumer_commits_what_it_reached_and_stops_on_close(stack: Stack) -> None:
    topic = stack.topic(1)
    stack.produce(topic, 10)
    group = name("g")
    with Client(stack.bootstrap, request_timeout=10) as client:
        consumer = client.consumer(
            group, [topic], auto_offset_reset="earliest", enable_auto_commit=False, **FAST
        )
        seen: list[Record] = []
        for record in consumer:
            seen.append(record)
            if record.offset == 3:
                # Records 0..3 were handed out: the commit covers them and not the buffered 4..9.
                assert consumer.commit() == {(topic, 0): 4}
            if len(seen) == 10:
                break
        assert [r.offset for r in seen] == list(range(10))

        closer = threading.Timer(0.5, consumer.close)
        closer.start()
        started = time.monotonic()
        more = list(consumer)  # waits for records until the close from the timer's thread
        closer.join()
        assert more == []
        assert time.monotonic() - started < 5
        assert client.admin.group_offsets(group) == {(topic, 0): 10}  # close committed the rest


def test_for_msg_in_push_consumer_acks_and_stops_on_close(stack: Stack) -> None:
    topic = stack.topic(2)
    stack.produce(topic, 10)
    with Client(stack.bootstrap, request_timeout=10) as client:
        pc = client.push_consumer(topic, name("s"), "shared", initial_position="earliest")
        got: list[Message] = []
        closer: threading.Timer | None = None
        started = time.monotonic()
        for msg in pc:
            pc.ack(msg)
            got.append(msg)
            if len(got) == 10:
                closer = threading.Timer(0.3, pc.close)  # the loop then waits, and ends at the close
                closer.start()
        assert closer is not None
        closer.join()
        assert sorted(int(m.value[1:]) for m in got) == list(range(10))
        assert time.monotonic() - started < 10
        assert pc.closed
