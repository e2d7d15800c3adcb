"""``sluice dispatcher`` settings: defaults < TOML (``--config``) < ``SLUICE_DISPATCHER_*`` env < flags."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta

from sluice.common.wire import wire_listen_port, wire_port_help
from sluice.errors import InvalidArgument
from sluice.security.settings import SecuritySettings
from sluice.server.config import ConnectionSettings, FilterSettings

ENV_PREFIX = "SLUICE_DISPATCHER_"
MiB = 1024 * 1024
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def ms(value: timedelta) -> int:
    return int(value.total_seconds() * 1000)


@dataclass(frozen=True)
class DispatcherConfig(SecuritySettings, ConnectionSettings, FilterSettings):
    """One dispatcher process."""

    dispatcher_id: str = field(
        default="",
        metadata={
            "help": "this dispatcher's id in the cluster; keep it across restarts (default: the host name)"
        },
    )
    host: str = field(
        default="127.0.0.1", metadata={"help": "address to bind the gRPC and metrics servers to"}
    )
    port: int = field(default=7603, metadata={"help": "gRPC port; 0 picks a free one"})
    wire_port: int | None = field(default=None, metadata={"help": wire_port_help(7613)})
    metrics_port: int = field(default=9603, metadata={"help": "Prometheus /metrics port; 0 picks a free one"})
    advertised_host: str = field(
        default="",
        metadata={
            "help": "host consumers connect to (default: --host, or POD_IP / the host name for a wildcard)"
        },
    )
    coordinator: str = field(default="", metadata={"help": "coordinator address host:port (required)"})
    cursor_flush_interval: timedelta = field(
        default=timedelta(milliseconds=100),
        metadata={"help": "how often changed durable cursors are written to the offset store, in one batch"},
    )
    metadata_refresh_interval: timedelta = field(
        default=timedelta(seconds=2),
        metadata={"help": "how often routing, brokers and the offset store are re-read from the coordinator"},
    )
    max_unacked: int = field(
        default=50_000,
        metadata={"help": "default per-consumer unacked limit when Subscribe says 0; 0: unlimited"},
    )
    ack_timeout: timedelta = field(
        default=timedelta(0), metadata={"help": "default ack timeout when Subscribe says 0; 0: off"}
    )
    nack_delay: timedelta = field(
        default=timedelta(seconds=1), metadata={"help": "default nack redelivery delay when Subscribe says 0"}
    )
    nack_backoff_max: timedelta = field(
        default=timedelta(0),
        metadata={"help": "cap of the exponential nack backoff (nack_delay * 2^(count-1)); 0: fixed delay"},
    )
    max_redeliver: int = field(
        default=0, metadata={"help": "default redeliveries before the DLQ when Subscribe says 0; 0: no DLQ"}
    )
    read_ahead_bytes: int = field(
        # 1 MiB, not 4: at issue 19's push rate it still holds ~7,000 records of 100 B per partition,
        # seven consumer windows, and with 4 partitions it kept `sluice up` 8-20 MB lower at the peak
        # and the servers' CPU per record no higher (docs/dispatcher.md, "The push path's CPU per record").
        default=1 * MiB,
        metadata={"help": "read-but-undispatched bytes held per subscription and partition"},
    )
    fetch_max_wait: timedelta = field(
        default=timedelta(milliseconds=500), metadata={"help": "long-poll wait of a partition feed's fetch"}
    )
    fetch_max_bytes: int = field(
        default=1 * MiB, metadata={"help": "bytes one fetch of one partition may return"}
    )
    idle_subscription_linger: timedelta = field(
        default=timedelta(seconds=30),
        metadata={
            "help": "a durable subscription without consumers stays loaded this long, then is unloaded "
            "(it stays listed, with its backlog, until deleted)"
        },
    )
    subscription_refresh_interval: timedelta = field(
        default=timedelta(seconds=10),
        metadata={
            "help": "how often idle durable subscriptions are re-read from the registry and their backlog "
            "recomputed (one ListOffsets per topic)"
        },
    )
    memory_budget_bytes: int = field(
        default=128 * MiB,
        metadata={
            "help": "bytes all subscriptions together may hold (read ahead, unacked, to redeliver); "
            "reading from brokers pauses at the limit (docs/memory.md); 0: no limit"
        },
    )
    subscription_memory_bytes: int = field(
        default=0,
        metadata={"help": "bytes one subscription may hold; 0: a quarter of memory_budget_bytes"},
    )
    log_level: str = field(default="INFO", metadata={"help": "DEBUG, INFO, WARNING or ERROR"})
    # Cardinality limits (docs/limits.md, "Cardinality and rate of change"); 0: no limit.
    max_subscriptions: int = field(
        default=10_000,
        metadata={
            "help": "subscriptions this dispatcher holds (loaded and idle durable ones); a Subscribe "
            "opening one more is refused with LIMIT_EXCEEDED"
        },
    )
    max_consumers_per_subscription: int = field(
        default=1_000,
        metadata={"help": "consumers attached to one subscription; one more is refused with LIMIT_EXCEEDED"},
    )

    def __post_init__(self) -> None:
        if not self.coordinator:
            raise InvalidArgument("--coordinator is required (host:port of the coordinator)")
        if not 0 <= self.port <= 65535 or not 0 <= self.metrics_port <= 65535:
            raise InvalidArgument("ports must be in [0, 65535]")
        wire_listen_port(self.port, self.wire_port)  # validates
        for name in (
            "cursor_flush_interval",
            "metadata_refresh_interval",
            "fetch_max_wait",
            "subscription_refresh_interval",
        ):
            if getattr(self, name) <= timedelta(0):
                raise InvalidArgument(f"{name} must be positive")
        for name in ("ack_timeout", "nack_delay", "nack_backoff_max", "idle_subscription_linger"):
            if getattr(self, name) < timedelta(0):
                raise InvalidArgument(f"{name} must not be negative")
        if self.max_unacked < 0 or self.max_redeliver < 0:
            raise InvalidArgument("max_unacked and max_redeliver must be >= 0")
        if self.max_subscriptions < 0 or self.max_consumers_per_subscription < 0:
            raise InvalidArgument("max_subscriptions and max_consumers_per_subscription must be >= 0")
        if self.memory_budget_bytes < 0 or self.subscription_memory_bytes < 0:
            raise InvalidArgument("memory_budget_bytes and subscription_memory_bytes must be >= 0")
        if self.read_ahead_bytes <= 0 or self.fetch_max_bytes <= 0:
            raise InvalidArgument("read_ahead_bytes and fetch_max_bytes must be positive")

    @property
    def advertised(self) -> str:
        if self.advertised_host:
            return self.advertised_host
        if self.host in WILDCARD_HOSTS:
            return os.environ.get("POD_IP") or socket.gethostname()
        return self.host

    @property
    def resolved_id(self) -> str:
        return self.dispatcher_id or os.environ.get("POD_NAME") or socket.gethostname()
