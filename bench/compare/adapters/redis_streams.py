"""Redis Streams: pipelined XADD; one consumer group, XREADGROUP COUNT 1000 (blocking) and XACK."""

from __future__ import annotations

from dataclasses import dataclass

from compare.adapters.base import Adapter, Endpoint
from compare.workload import Feed, Sink, sent_at

BATCH = 1000


@dataclass
class RedisStreams(Adapter):
    def prepare(self, endpoint: Endpoint, dest: str) -> None:
        import redis

        with redis.Redis.from_url(endpoint["url"]) as r:
            r.xgroup_create(dest, "g", id="0", mkstream=True)

    def cleanup(self, endpoint: Endpoint, dest: str) -> None:
        import redis

        with redis.Redis.from_url(endpoint["url"]) as r:
            r.delete(dest)

    def produce(self, endpoint: Endpoint, dest: str, feed: Feed) -> None:
        import redis

        with redis.Redis.from_url(endpoint["url"]) as r:
            pipe = r.pipeline(transaction=False)
            while not feed.done:
                records = feed.batch(BATCH)
                if not records:
                    continue
                sent = sent_at(records[0][1])
                for key, value in records:
                    pipe.xadd(dest, {b"k": key, b"v": value})
                pipe.execute()  # the replies are the acknowledgements
                feed.acked(sent, len(records))

    def consume(self, endpoint: Endpoint, dest: str, sink: Sink) -> None:
        import redis

        with redis.Redis.from_url(endpoint["url"]) as r:
            while not sink.finished():
                answer = r.xreadgroup("g", "c", {dest: ">"}, count=BATCH, block=200)
                # RESP3 answers {stream: entries}, RESP2 [[stream, entries]].
                streams = answer.items() if isinstance(answer, dict) else answer or ()
                for _stream, entries in streams:
                    fields = [f for _id, f in entries]
                    sink.add_many([f[b"k"] for f in fields], [f[b"v"] for f in fields])
                    r.xack(dest, "g", *[entry_id for entry_id, _f in entries])
