"""Configuration of ``sluice offset-store`` (env prefix ``SLUICE_OFFSET_STORE_``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.security.settings import SecuritySettings
from sluice.server.config import ConnectionSettings

ENV_PREFIX = "SLUICE_OFFSET_STORE_"


@dataclass(frozen=True)
class OffsetStoreConfig(SecuritySettings, ConnectionSettings):
    host: str = field(
        default="127.0.0.1", metadata={"help": "address to bind the gRPC and metrics servers to"}
    )
    port: int = field(default=7602, metadata={"help": "gRPC port; 0 picks a free one"})
    metrics_port: int = field(default=9602, metadata={"help": "Prometheus /metrics port; 0 picks a free one"})
    redis_url: str = field(
        default="",
        metadata={"help": "Redis holding offsets and cursors, e.g. redis://host:6379/0 (required)"},
    )
    key_prefix: str = field(
        default="sluice", metadata={"help": "prefix of every Redis key (docs/redis-schema.md)"}
    )
    coordinator: str = field(
        default="",
        metadata={
            "help": "coordinator host:port, used to resolve earliest/latest/timestamp resets through "
            "Metadata and the brokers' ListOffsets; without it only explicit offsets can be reset"
        },
    )
    commit_replicas: int = field(
        default=0,
        metadata={
            "help": "Redis replicas that must hold a commit (or a saved cursor, a reset) before it is "
            "acknowledged (Redis WAIT); 0 acknowledges once the primary has it. With replicas, 1 makes an "
            "acknowledged commit survive a Sentinel failover (docs/offset-store.md, 'Redis failover')"
        },
    )
    commit_replicas_timeout_ms: int = field(
        default=2000,
        metadata={"help": "how long a write waits for --commit-replicas; then NOT_ENOUGH_REPLICAS"},
    )
    log_level: str = field(default="INFO", metadata={"help": "DEBUG, INFO, WARNING or ERROR"})
