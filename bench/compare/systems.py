"""Every configuration compared, with its durability label, and how to start each one's servers.

Pairs (``pair``: the Sluice figure a peer's ratios are taken against) follow the durability class:
no fsync before the ack (Redis without persistence, NATS with its default sync, RabbitMQ streams)
and Redis AOF ``everysec`` sit next to Sluice ``flush=interval``; RabbitMQ's classic queue, whose
confirms come after an fsync, next to Sluice ``flush=always``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from compare import servers
from compare.adapters.base import Adapter
from compare.adapters.nats_jetstream import NatsJetStream
from compare.adapters.rabbitmq import RabbitMQ
from compare.adapters.redis_streams import RedisStreams
from compare.adapters.sluice import SluicePull, SluicePush

INTERVAL = "sluice-pull-4p-interval"
ALWAYS = "sluice-pull-4p-always"

ADAPTERS: list[Adapter] = [
    SluicePull(INTERVAL, "Sluice pull, 4 partitions", "flush=interval (page cache, fsync every interval)",
               "sluice-interval", sluice=True),
    SluicePull("sluice-pull-1p-interval", "Sluice pull, 1 partition", "flush=interval",
               "sluice-interval", sluice=True, partitions=1),
    SluicePull(ALWAYS, "Sluice pull, 4 partitions, fsync", "flush=always (fsync before the ack)",
               "sluice-always", sluice=True),
    SluicePush("sluice-push-shared", "Sluice push, Shared", "flush=interval", "sluice-interval", sluice=True),
    SluicePull("sluice-pull-4p-rf3", "Sluice pull, factor 3, acks=all", "flush=interval, 3 replicas",
               "sluice-rf3", sluice=True, replication_factor=3),
    RedisStreams("redis", "Redis Streams", "no persistence (memory only)", "redis-none", pair=INTERVAL),
    RedisStreams("redis-aof", "Redis Streams, AOF", "AOF appendfsync everysec", "redis-aof", pair=INTERVAL),
    NatsJetStream("nats", "NATS JetStream", "file store, server's default sync (no fsync per ack)", "nats",
                  pair=INTERVAL),
    RabbitMQ("rabbitmq-classic", "RabbitMQ classic queue", "durable, persistent, confirms (fsync)",
             "rabbitmq", pair=ALWAYS),
    RabbitMQ("rabbitmq-stream", "RabbitMQ stream queue", "stream, confirms (no fsync per ack)", "rabbitmq",
             pair=INTERVAL, queue_type="stream"),
]  # fmt: skip

#: The configurations a QUICK run compares: one of each peer and Sluice's pull (both flush policies)
#: and push, enough to prove every adapter and the report end to end within about a minute.
QUICK_ADAPTERS = [
    INTERVAL,
    ALWAYS,
    "sluice-push-shared",
    "redis",
    "redis-aof",
    "nats",
    "rabbitmq-classic",
    "rabbitmq-stream",
]

Starter = Callable[[servers.Ports, Path], servers.Server]

SERVERS: dict[str, Starter] = {
    "redis-none": lambda ports, d: servers.start_redis(ports, d, "redis-none"),
    "redis-aof": lambda ports, d: servers.start_redis(ports, d, "redis-aof", appendfsync="everysec"),
    "nats": servers.start_nats,
    "rabbitmq": servers.start_rabbitmq,
    "sluice-interval": lambda ports, d: servers.start_sluice(ports, d, "sluice-interval", "interval"),
    "sluice-always": lambda ports, d: servers.start_sluice(ports, d, "sluice-always", "always"),
    "sluice-rf3": lambda ports, d: servers.start_sluice(ports, d, "sluice-rf3", "interval", brokers=3),
}


def by_name(names: list[str] | None) -> list[Adapter]:
    if not names:
        return list(ADAPTERS)
    known = {a.name: a for a in ADAPTERS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown system(s) {unknown}; known: {sorted(known)}")
    return [known[n] for n in names]
