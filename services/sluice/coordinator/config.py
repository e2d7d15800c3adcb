"""``sluice coordinator`` settings: defaults < TOML file (--config) < SLUICE_COORDINATOR_* env < flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from sluice.common.redis_client import validate_url as validate_redis_url
from sluice.coordinator.cluster.model import Endpoint
from sluice.coordinator.cluster.replication import MAX_REPLICATION_FACTOR
from sluice.coordinator.cluster.state import ClusterSettings
from sluice.coordinator.election import validate_election
from sluice.coordinator.group_metrics import DEFAULT_MAX_GROUPS, GroupMetricsPolicy
from sluice.coordinator.groups.model import GroupSettings
from sluice.coordinator.limits import CoordinatorLimits
from sluice.coordinator.producer_ids import DEFAULT_PER_MINUTE
from sluice.errors import InvalidArgument
from sluice.offsetstore.storage import ReplicaWait
from sluice.security.rate_limit import LimiterSettings
from sluice.security.settings import SecuritySettings
from sluice.server.config import ConnectionSettings

ENV_PREFIX = "SLUICE_COORDINATOR_"
DEFAULT_PORT = 7600
DEFAULT_METRICS_PORT = 9600


def _ms(d: timedelta) -> int:
    return int(d.total_seconds() * 1000)


@dataclass(frozen=True)
class CoordinatorConfig(SecuritySettings, ConnectionSettings):
    host: str = field(default="127.0.0.1", metadata={"help": "address to bind the gRPC server to"})
    port: int = field(default=DEFAULT_PORT, metadata={"help": "gRPC port; 0 picks a free one"})
    metrics_port: int = field(
        default=DEFAULT_METRICS_PORT, metadata={"help": "HTTP port of /metrics; 0 picks a free one"}
    )
    redis_url: str = field(
        default="",
        metadata={"help": "Redis holding the cluster metadata, e.g. redis://127.0.0.1:6379/0 (required)"},
    )
    key_prefix: str = field(
        default="sluice", metadata={"help": "prefix of every Redis key this service uses"}
    )
    broker_session_timeout: timedelta = field(
        default=timedelta(seconds=10),
        metadata={"help": "a broker silent for longer is marked not alive (no new partitions go to it)"},
    )
    auto_leader_rebalance: bool = field(
        default=True,
        metadata={"help": "move leadership back to each partition's preferred replica once it is in sync"},
    )
    leader_imbalance_check_interval: timedelta = field(
        default=timedelta(seconds=30),
        metadata={"help": "how often the automatic rebalance looks (it also looks after an ISR expansion)"},
    )
    leader_imbalance_per_broker_percentage: int = field(
        default=10,
        metadata={"help": "rebalance when more of a broker's preferred partitions are led elsewhere"},
    )
    broker_heartbeat_interval: timedelta = field(
        default=timedelta(seconds=2), metadata={"help": "how often brokers are told to heartbeat"}
    )
    dispatcher_session_timeout: timedelta = field(
        default=timedelta(seconds=10),
        metadata={"help": "a dispatcher silent for longer is marked not alive (its partitions re-route)"},
    )
    dispatcher_heartbeat_interval: timedelta = field(
        default=timedelta(seconds=2),
        metadata={"help": "how often dispatchers are told to re-register (their heartbeat)"},
    )
    producer_ids_per_minute: int = field(
        default=DEFAULT_PER_MINUTE,
        metadata={
            "help": "new idempotent producer ids one client id may take a minute (bursts up to this many); "
            "more are refused with THROTTLED (KIP-936: each id is state on every partition it writes)"
        },
    )
    metadata_replicas: int = field(
        default=0,
        metadata={
            "help": "Redis replicas that must hold every metadata write (topics, leaders, ISRs, epochs, "
            "groups) before the coordinator acts on it or answers (Redis WAIT); 0: the primary alone. "
            "With replicas, 1 keeps a Sentinel failover from losing a controller decision brokers obeyed "
            "(docs/replication.md, 'Controller state that cannot roll back')"
        },
    )
    metadata_replicas_timeout_ms: int = field(
        default=2000,
        metadata={"help": "how long a write waits for --metadata-replicas (then NOT_ENOUGH_REPLICAS)"},
    )
    default_replication_factor: int = field(
        default=1,
        metadata={
            "help": "replicas per partition of a topic created without --replication-factor; creating one "
            "needs at least this many live brokers (the Helm chart sets 3, `sluice up --brokers N` min(3, N))"
        },
    )
    broker_update_timeout: timedelta = field(
        default=timedelta(seconds=2),
        metadata={"help": "deadline of one UpdatePartitions push to a broker (heartbeats reconcile a miss)"},
    )
    group_heartbeat_interval: timedelta = field(
        default=timedelta(seconds=3),
        metadata={
            "help": "default heartbeat interval of consumer-group members (a group's config overrides it)"
        },
    )
    group_session_timeout: timedelta = field(
        default=timedelta(seconds=45),
        metadata={"help": "a group member silent for longer is removed and its partitions reassigned"},
    )
    group_rebalance_timeout: timedelta = field(
        default=timedelta(seconds=60),
        metadata={"help": "a member that does not release a revoked partition within this is fenced"},
    )
    group_assignment_interval: timedelta = field(
        default=timedelta(milliseconds=100),
        metadata={"help": "a group's target assignment is recomputed at most this often (joins are batched)"},
    )
    group_offsets_retention: timedelta = field(
        default=timedelta(days=7),
        metadata={
            "help": "a group's committed offsets of a (topic, filter) that no member has read for this long "
            "are deleted, with the filter's offset track (Kafka's offsets.retention.minutes); 0 keeps them "
            "until the group is deleted"
        },
    )
    group_lag_interval: timedelta = field(
        default=timedelta(seconds=10),
        metadata={"help": "how often consumer lag metrics are refreshed (0 turns the refresh off)"},
    )
    group_metrics_max: int = field(
        default=DEFAULT_MAX_GROUPS,
        metadata={
            "help": "at most this many consumer groups get per-group series on /metrics: those with members "
            "first, then those described recently, then the rest by name (0: none; every group is still "
            "counted in sluice_coordinator_groups)"
        },
    )
    group_metrics_groups: str = field(
        default="",
        metadata={
            "help": "export per-group series only for these groups: names or regular expressions, comma "
            "separated, each matched in full (still at most --group-metrics-max); their lag is refreshed "
            "even while they are empty"
        },
    )
    offset_store: str = field(
        default="", metadata={"help": "offset-store address (host:port) that Metadata hands to clients"}
    )
    advertised_host: str = field(
        default="",
        metadata={
            "help": "host clients should use to reach this coordinator (default: --host, or this "
            "machine's name when --host is a wildcard)"
        },
    )
    election: str = field(
        default="none",
        metadata={
            "help": "leader election among coordinator replicas: redis (a lease key in --redis-url), "
            "kubernetes (a coordination.k8s.io Lease; the Helm chart sets this) or none (one coordinator; "
            "each start takes over from the last)"
        },
    )
    lease_name: str = field(
        default="", metadata={"help": "--election kubernetes: name of the Lease (the chart sets it)"}
    )
    lease_namespace: str = field(
        default="",
        metadata={"help": "--election kubernetes: namespace of the Lease (default: $POD_NAMESPACE)"},
    )
    identity: str = field(
        default="",
        metadata={"help": "this replica's name in the election (default: $POD_NAME, else hostname:pid)"},
    )
    lease_duration: timedelta = field(
        default=timedelta(seconds=15),
        metadata={"help": "a standby takes over from a leader that has not renewed its lease for this long"},
    )
    renew_deadline: timedelta = field(
        default=timedelta(seconds=10),
        metadata={
            "help": "a leader that could not renew for this long stops leading; shorter than "
            "--lease-duration, so it stops before a standby may take over"
        },
    )
    retry_period: timedelta = field(
        default=timedelta(seconds=2),
        metadata={"help": "how often the leader renews its lease and standbys look at it"},
    )
    log_level: str = field(default="INFO", metadata={"help": "DEBUG, INFO, WARNING or ERROR"})
    login_failures_per_address: int = field(
        default=20,
        metadata={
            "help": "failed logins one client address may make per --login-failure-window; further "
            "attempts are refused with THROTTLED at once (docs/security.md, rate limiting)"
        },
    )
    login_failures_per_user: int = field(
        default=10, metadata={"help": "failed logins for one user name per --login-failure-window"}
    )
    login_failure_window: timedelta = field(
        default=timedelta(minutes=1), metadata={"help": "the window of the failed-login limits"}
    )
    # Cardinality limits and the mutation quota (docs/limits.md, "Cardinality and rate of change").
    max_topics: int = field(
        default=CoordinatorLimits.max_topics,
        metadata={"help": "topics the cluster may hold; more are refused with LIMIT_EXCEEDED (0: no limit)"},
    )
    max_partitions_per_topic: int = field(
        default=CoordinatorLimits.max_partitions_per_topic,
        metadata={"help": "partitions one topic may have (0: the format's own bound, 10,000)"},
    )
    max_partitions: int = field(
        default=CoordinatorLimits.max_partitions,
        metadata={"help": "partitions of all topics together (0: no limit)"},
    )
    max_groups: int = field(
        default=CoordinatorLimits.max_groups,
        metadata={"help": "consumer groups with members or state; a join creating one more is refused"},
    )
    max_members_per_group: int = field(
        default=CoordinatorLimits.max_members_per_group,
        metadata={"help": "members one consumer group may have; one more joining is refused (0: no limit)"},
    )
    partition_mutations_per_second: float = field(
        default=CoordinatorLimits.partition_mutations_per_second,
        metadata={
            "help": "partitions one principal may create, add or delete per second (Kafka's controller "
            "mutation quota, KIP-599); over it: THROTTLING_QUOTA_EXCEEDED with the wait (0: no quota)"
        },
    )
    partition_mutation_burst: int = field(
        default=CoordinatorLimits.partition_mutation_burst,
        metadata={
            "help": "partitions one principal may mutate at once (its bucket) before the per-second "
            "rate applies"
        },
    )

    group_creations_per_second: float = field(
        default=CoordinatorLimits.group_creations_per_second,
        metadata={"help": "consumer groups one principal may create per second (0: no quota)"},
    )
    group_creation_burst: int = field(
        default=CoordinatorLimits.group_creation_burst,
        metadata={"help": "groups one principal may create at once before the per-second rate applies"},
    )

    def coordinator_limits(self) -> CoordinatorLimits:
        try:
            return CoordinatorLimits(
                max_topics=self.max_topics,
                max_partitions_per_topic=self.max_partitions_per_topic,
                max_partitions=self.max_partitions,
                max_groups=self.max_groups,
                max_members_per_group=self.max_members_per_group,
                partition_mutations_per_second=self.partition_mutations_per_second,
                partition_mutation_burst=self.partition_mutation_burst,
                group_creations_per_second=self.group_creations_per_second,
                group_creation_burst=self.group_creation_burst,
            ).validate()
        except ValueError as exc:
            raise InvalidArgument(f"--{str(exc).replace('_', '-')}") from None

    def login_limits(self) -> LimiterSettings:
        return LimiterSettings(
            self.login_failures_per_address,
            self.login_failures_per_user,
            self.login_failure_window.total_seconds(),
        )

    def validate(self) -> CoordinatorConfig:
        """Reject contradictory or missing settings with a message that names the flag."""
        if not self.redis_url:
            raise InvalidArgument(
                f"--redis-url (or {ENV_PREFIX}REDIS_URL) is required: "
                "the coordinator keeps its metadata in Redis"
            )
        validate_redis_url(self.redis_url)
        for name in ("port", "metrics_port"):
            value = getattr(self, name)
            if not 0 <= value <= 65535:
                raise InvalidArgument(f"--{name.replace('_', '-')} {value} is outside 0-65535")
        if not self.key_prefix:
            raise InvalidArgument("--key-prefix must not be empty")
        for kind in ("broker", "dispatcher"):
            interval: timedelta = getattr(self, f"{kind}_heartbeat_interval")
            timeout: timedelta = getattr(self, f"{kind}_session_timeout")
            if interval <= timedelta(0) or timeout <= interval:
                raise InvalidArgument(
                    f"--{kind}-heartbeat-interval ({interval.total_seconds():g}s) must be positive and "
                    f"shorter than --{kind}-session-timeout ({timeout.total_seconds():g}s)"
                )
        if not timedelta(0) < self.group_heartbeat_interval < self.group_session_timeout:
            raise InvalidArgument(
                f"--group-heartbeat-interval ({self.group_heartbeat_interval.total_seconds():g}s) must be "
                f"positive and shorter than --group-session-timeout "
                f"({self.group_session_timeout.total_seconds():g}s)"
            )
        if self.group_rebalance_timeout <= timedelta(0) or self.group_assignment_interval < timedelta(0):
            raise InvalidArgument(
                "--group-rebalance-timeout must be positive, --group-assignment-interval >= 0"
            )
        if self.group_offsets_retention < timedelta(0):
            raise InvalidArgument("--group-offsets-retention must be >= 0 (0: keep offsets until deleted)")
        if self.group_lag_interval < timedelta(0):
            raise InvalidArgument("--group-lag-interval must be >= 0")
        self.group_metrics_policy()
        if not 1 <= self.default_replication_factor <= MAX_REPLICATION_FACTOR:
            raise InvalidArgument(
                f"--default-replication-factor must be between 1 and {MAX_REPLICATION_FACTOR}, "
                f"got {self.default_replication_factor}"
            )
        self.metadata_wait()
        if self.broker_update_timeout <= timedelta(0):
            raise InvalidArgument("--broker-update-timeout must be positive")
        if self.offset_store:
            Endpoint.parse(self.offset_store)
        validate_election(self)
        self.login_limits()
        self.coordinator_limits()
        return self

    def metadata_wait(self) -> ReplicaWait:
        """``--metadata-replicas`` and its timeout, checked (the bounds of ``--commit-replicas``)."""
        replicas, timeout_ms = self.metadata_replicas, self.metadata_replicas_timeout_ms
        if not 0 <= replicas <= 16:
            raise InvalidArgument(f"--metadata-replicas must be in [0, 16], got {replicas}")
        if not 1 <= timeout_ms <= 60_000:
            raise InvalidArgument(f"--metadata-replicas-timeout-ms must be in [1, 60000], got {timeout_ms}")
        return ReplicaWait(replicas, timeout_ms)

    def cluster_settings(self) -> ClusterSettings:
        return ClusterSettings(
            broker_heartbeat_interval_ms=_ms(self.broker_heartbeat_interval),
            broker_session_timeout_ms=_ms(self.broker_session_timeout),
            dispatcher_heartbeat_interval_ms=_ms(self.dispatcher_heartbeat_interval),
            dispatcher_session_timeout_ms=_ms(self.dispatcher_session_timeout),
            default_replication_factor=self.default_replication_factor,
            auto_leader_rebalance=self.auto_leader_rebalance,
            leader_imbalance_check_interval_ms=_ms(self.leader_imbalance_check_interval),
            leader_imbalance_per_broker_percentage=self.leader_imbalance_per_broker_percentage,
        )

    def group_settings(self) -> GroupSettings:
        interval = _ms(self.group_heartbeat_interval)
        return GroupSettings(
            heartbeat_interval_ms=interval,
            session_timeout_ms=_ms(self.group_session_timeout),
            rebalance_timeout_ms=_ms(self.group_rebalance_timeout),
            assignment_interval_ms=_ms(self.group_assignment_interval),
            reconcile_heartbeat_interval_ms=min(interval, max(100, interval // 10)),
            offsets_retention_ms=_ms(self.group_offsets_retention),
            max_groups=self.max_groups,
            max_members_per_group=self.max_members_per_group,
        )

    def group_metrics_policy(self) -> GroupMetricsPolicy:
        return GroupMetricsPolicy.parse(self.group_metrics_max, self.group_metrics_groups)

    def offset_store_endpoint(self) -> Endpoint | None:
        return Endpoint.parse(self.offset_store) if self.offset_store else None
