"""Sluice through its own SDK: a producer with the SDK's defaults (acks=all, idempotent; linger 0 when
paced, as bench/e2e_latency.py runs it) sending each batch with ``send_many``, and either a pull consumer
group (``poll_columns``, auto-commit) or a Shared push subscription acknowledging every message (batch
receive, ``ack`` per message)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compare.adapters.base import Adapter, Endpoint
from compare.workload import Feed, Sink, sent_at

BATCH = 1000


@dataclass
class SluicePull(Adapter):
    partitions: int = 4
    replication_factor: int | None = None

    def prepare(self, endpoint: Endpoint, dest: str) -> None:
        from sluice import Client

        with Client(endpoint["bootstrap"]) as client:
            client.admin.create_topic(dest, self.partitions, replication_factor=self.replication_factor)

    def cleanup(self, endpoint: Endpoint, dest: str) -> None:
        from sluice import Client

        with Client(endpoint["bootstrap"]) as client:
            client.admin.delete_topic(dest)

    def produce(self, endpoint: Endpoint, dest: str, feed: Feed) -> None:
        from sluice import Client

        settings: dict[str, Any] = {"linger": 0} if feed.rate else {}
        with Client(endpoint["bootstrap"]) as client:
            producer = client.producer(dest, **settings)
            send_many = producer.send_many
            while not feed.done:
                keys, values = feed.columns(BATCH)
                if not keys:
                    continue
                # The SDK's bulk send (docs/producer.md, "Sending many records at once"), as Redis's
                # adapter pipelines: one call and one future a batch, not one a record.
                sent = send_many(values, keys)
                sent.add_done_callback(_acked(feed, sent_at(values[0]), len(keys)))
            producer.flush()
            producer.close()

    def consume(self, endpoint: Endpoint, dest: str, sink: Sink) -> None:
        from sluice import Client

        with Client(endpoint["bootstrap"]) as client:
            consumer = client.consumer(f"{dest}-g", [dest], auto_offset_reset="earliest")
            # The SDK's column-wise poll (docs/consumer.md, "Records as columns"): each partition's
            # keys and values as lists, no record object each; commits as poll()'s (auto-commit). Up to
            # 1,000 records a poll, as Redis's XREADGROUP COUNT and NATS's fetch take.
            poll_columns, add_many = consumer.poll_columns, sink.add_many
            while not sink.finished():
                for cols in poll_columns(0.2, BATCH).values():
                    add_many(cols.keys, cols.values)  # type: ignore[arg-type]
            consumer.close()


@dataclass
class SluicePush(SluicePull):
    def consume(self, endpoint: Endpoint, dest: str, sink: Sink) -> None:
        from sluice import Client

        with Client(endpoint["bootstrap"]) as client:
            pc = client.push_consumer(
                dest, f"{dest}-s", "shared", initial_position="earliest", receiver_queue_size=BATCH
            )
            # Batch receive (checked by the harness batch-wise, as the other adapters' batches are), and
            # every message acknowledged on its own with the per-message ``ack``
            # (issue 19: "acking every message"); the SDK groups the acks on the wire by itself
            # (docs/push-consumer.md, "Acks"), as Pulsar's client does.
            receive_many, ack, add_many = pc.receive_many, pc.ack, sink.add_many
            while not sink.finished():
                msgs = receive_many(BATCH, timeout=0.2)
                add_many([msg.key or b"" for msg in msgs], [msg.value for msg in msgs])
                for msg in msgs:
                    ack(msg)
            pc.close()


def _acked(feed: Feed, sent: float, count: int) -> Any:
    def done(_future: object) -> None:
        feed.acked(sent, count)

    return done
