"""``sluice broker`` settings: defaults < TOML file (``--config``) < ``SLUICE_BROKER_*`` env < flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from sluice.broker.fetch import FetchCaps
from sluice.broker.flusher import FlushPolicy
from sluice.broker.log.config import LogConfig
from sluice.broker.log.handles import DEFAULT_READ_HANDLES
from sluice.broker.log.manager import DEFAULT_DESCRIPTOR_RESERVE
from sluice.broker.log.space import DEFAULT_MIN_FREE_BYTES
from sluice.common.wire import wire_listen_port, wire_port_help
from sluice.errors import InvalidArgument
from sluice.security.settings import SecuritySettings
from sluice.server.config import ConnectionSettings, FilterSettings

ENV_PREFIX = "SLUICE_BROKER_"
MiB = 1024 * 1024


def _ms(value: timedelta) -> int:
    return int(value.total_seconds() * 1000)


@dataclass(frozen=True)
class BrokerConfig(SecuritySettings, ConnectionSettings, FilterSettings):
    """One broker process."""

    broker_id: int = field(default=0, metadata={"help": "this broker's id in the cluster (>= 0)"})
    host: str = field(
        default="127.0.0.1", metadata={"help": "address to bind the gRPC and metrics servers to"}
    )
    port: int = field(default=7601, metadata={"help": "gRPC port; 0 picks a free one"})
    wire_port: int | None = field(default=None, metadata={"help": wire_port_help(7611)})
    advertised_host: str = field(
        default="", metadata={"help": "host clients should connect to (default: --host)"}
    )
    metrics_port: int = field(default=9601, metadata={"help": "Prometheus /metrics port; 0 picks a free one"})
    # Behind a NodePort or a port-mapping load balancer the port clients reach differs from the bound one
    # (the chart's external access, docs/kubernetes.md): the broker registers these instead.
    advertised_port: int = field(
        default=0, metadata={"help": "gRPC port clients should connect to (0: the bound --port)"}
    )
    advertised_wire_port: int = field(
        default=0, metadata={"help": "wire port clients should connect to (0: the bound wire port)"}
    )
    data_dir: Path = field(
        default=Path("sluice-data/broker"), metadata={"help": "directory of the partition logs"}
    )
    rack: str = field(
        default="",
        metadata={
            "help": "this broker's rack or zone, registered with the coordinator, which spreads each "
            "partition's replicas across racks (the Helm chart sets the node's zone); empty: unknown"
        },
    )
    coordinator: str = field(
        default="",
        metadata={
            "help": "coordinator address host:port to register with; empty: standalone, partitions "
            "are assigned only through UpdatePartitions"
        },
    )
    flush: str = field(
        default="interval",
        metadata={
            "help": "fsync policy: always (group commit before acks), interval, or never (the OS decides)"
        },
    )
    controlled_shutdown_timeout: timedelta = field(
        default=timedelta(seconds=30),
        metadata={
            "help": "on SIGTERM, how long to wait for the controller to move this broker's leaderships "
            "away before stopping anyway; 0: stop at once"
        },
    )
    flush_interval: timedelta = field(
        default=timedelta(seconds=1), metadata={"help": "how often flush=interval fsyncs appended partitions"}
    )
    segment_bytes: int = field(default=128 * MiB, metadata={"help": "default segment size before a roll"})
    segment_age: timedelta = field(
        default=timedelta(days=7), metadata={"help": "default age of the active segment before a roll"}
    )
    retention_bytes: int = field(
        default=0, metadata={"help": "default per-partition size kept; 0: unlimited"}
    )
    retention_age: timedelta = field(
        default=timedelta(days=7), metadata={"help": "default age of records kept; 0: unlimited"}
    )
    index_interval_bytes: int = field(
        default=4096, metadata={"help": "log bytes between sparse index entries"}
    )
    max_batch_bytes: int = field(
        default=16 * MiB, metadata={"help": "largest record batch a producer may send"}
    )
    max_record_headers: int = field(
        default=1_000, metadata={"help": "most headers one produced record may carry (more: LIMIT_EXCEEDED)"}
    )
    max_record_header_bytes: int = field(
        default=MiB, metadata={"help": "most bytes one produced record's headers may take"}
    )
    retention_check_interval: timedelta = field(
        default=timedelta(seconds=30),
        metadata={"help": "how often retention runs and aged segments are rolled"},
    )
    replica_lag_time_max: timedelta = field(
        default=timedelta(seconds=10),
        metadata={
            "help": "a follower not caught up with the leader's log end for this long leaves the "
            "in-sync set (docs/replication.md)"
        },
    )
    scrub_rate: int = field(
        default=4 * MiB,
        metadata={
            "help": "bytes/s the background scrub re-verifies sealed segments' CRCs at (0: off; "
            'docs/replication.md, "The scrub")'
        },
    )
    scrub_interval: timedelta = field(
        default=timedelta(hours=24),
        metadata={"help": "how often the scrub starts a full pass again (new segments: within 10 s)"},
    )
    max_wait: timedelta = field(
        default=timedelta(seconds=30),
        metadata={"help": "cap on a fetch's max_wait_ms (beyond: INVALID_ARGUMENT)"},
    )
    max_fetch_bytes: int = field(
        default=64 * MiB, metadata={"help": "cap on a fetch's max_bytes (beyond: INVALID_ARGUMENT)"}
    )
    filter_scan_bytes: int = field(
        default=4 * MiB,
        metadata={"help": "raw log bytes a filtered fetch walks per partition per request before answering"},
    )
    max_fetch_sessions: int = field(
        default=1000,
        metadata={"help": "incremental fetch sessions kept (least recently used evicted); 0: none"},
    )
    fetch_session_idle: timedelta = field(
        default=timedelta(minutes=2), metadata={"help": "an unused fetch session is dropped after this"}
    )
    segment_read_handles: int = field(
        default=DEFAULT_READ_HANDLES,
        metadata={"help": "read descriptors kept open on sealed segments (LRU, shared by all partitions)"},
    )
    descriptor_reserve: int = field(
        default=DEFAULT_DESCRIPTOR_RESERVE,
        metadata={
            "help": "descriptors kept free for connections: a partition that would eat into them "
            "is refused with STORAGE_ERROR"
        },
    )
    storage_min_free_bytes: int = field(
        default=DEFAULT_MIN_FREE_BYTES,
        metadata={
            "help": "produce is refused (STORAGE_FULL, retriable) while the data directory has less free "
            "space than this, so indexes and checkpoints can still be written; 0 disables"
        },
    )
    produce_memory_bytes: int = field(
        default=256 * MiB,
        metadata={
            "help": "budget of produce bytes received and not yet answered, over gRPC and the wire "
            "port (Kafka's queued.max.request.bytes); when reached the broker stops reading "
            "(docs/memory.md); 0: unlimited"
        },
    )
    fetch_memory_bytes: int = field(
        default=256 * MiB,
        metadata={
            "help": "budget of fetch answer bytes assembled and not yet written; when reached new "
            "fetches and follow rounds wait (docs/memory.md); 0: unlimited"
        },
    )
    log_level: str = field(default="INFO", metadata={"help": "DEBUG, INFO, WARNING or ERROR"})

    def __post_init__(self) -> None:
        FlushPolicy.parse(self.flush)
        if self.broker_id < 0:
            raise InvalidArgument(f"broker_id must be >= 0, got {self.broker_id}")
        if not 0 <= self.port <= 65535 or not 0 <= self.metrics_port <= 65535:
            raise InvalidArgument("ports must be in [0, 65535]")
        wire_listen_port(self.port, self.wire_port)  # validates
        if self.flush_interval <= timedelta(0) or self.retention_check_interval <= timedelta(0):
            raise InvalidArgument("flush_interval and retention_check_interval must be positive")
        if self.max_wait < timedelta(0) or self.max_fetch_bytes <= 0 or self.filter_scan_bytes <= 0:
            raise InvalidArgument("max_wait, max_fetch_bytes and filter_scan_bytes must be positive")
        if self.max_fetch_sessions < 0:
            raise InvalidArgument("max_fetch_sessions must be >= 0")
        if self.segment_read_handles < 1:
            raise InvalidArgument(f"segment_read_handles must be >= 1, got {self.segment_read_handles}")
        if self.produce_memory_bytes < 0 or self.fetch_memory_bytes < 0:
            raise InvalidArgument("produce_memory_bytes and fetch_memory_bytes must be >= 0 (0: unlimited)")
        if self.scrub_rate < 0 or self.scrub_interval <= timedelta(0):
            raise InvalidArgument("scrub_rate must be >= 0 (0: off) and scrub_interval positive")
        if self.descriptor_reserve < 0:
            raise InvalidArgument(f"descriptor_reserve must be >= 0, got {self.descriptor_reserve}")
        if self.storage_min_free_bytes < 0:
            raise InvalidArgument(f"storage_min_free_bytes must be >= 0, got {self.storage_min_free_bytes}")
        for name in ("advertised_port", "advertised_wire_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise InvalidArgument(f"{name} must be a port (0..65535), got {getattr(self, name)}")
        if len(self.rack) > 128 or any(c.isspace() or not c.isprintable() for c in self.rack):
            raise InvalidArgument(f"--rack {self.rack[:128]!r}: at most 128 printable characters, no spaces")
        self.log_defaults()  # validates the log settings

    @property
    def wire_listen_port(self) -> int | None:
        """The wire port to bind (0: any free one), or None to serve none."""
        return wire_listen_port(self.port, self.wire_port)

    @property
    def flush_policy(self) -> FlushPolicy:
        return FlushPolicy.parse(self.flush)

    @property
    def advertised(self) -> str:
        return self.advertised_host or self.host

    def log_defaults(self) -> LogConfig:
        """The broker-wide LogConfig; a topic's non-zero settings override it."""
        return LogConfig(
            segment_bytes=self.segment_bytes,
            segment_ms=_ms(self.segment_age),
            retention_bytes=self.retention_bytes or -1,
            retention_ms=_ms(self.retention_age) or -1,
            index_interval_bytes=self.index_interval_bytes,
            max_batch_bytes=self.max_batch_bytes,
            max_record_headers=self.max_record_headers,
            max_record_header_bytes=self.max_record_header_bytes,
        )

    def fetch_caps(self) -> FetchCaps:
        return FetchCaps(
            max_wait_ms=_ms(self.max_wait),
            max_bytes=self.max_fetch_bytes,
            scan_bytes=self.filter_scan_bytes,
            scan_chunk_bytes=min(MiB, self.filter_scan_bytes),
        )
