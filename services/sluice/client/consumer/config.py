"""ConsumerConfig: every setting of a group consumer in one typed, validated dataclass.

Build one with keywords, from a mapping (``ConsumerConfig.from_dict``, e.g. a TOML
table) or from the environment (``SLUICE_CONSUMER_AUTO_OFFSET_RESET=earliest``),
and derive variants with :meth:`ConsumerConfig.replace`. ``client.consumer(...,
**overrides)`` goes through ``replace``. Unknown keys and bad values are rejected
with :class:`~sluice.errors.InvalidArgument` naming the key. Durations are
``timedelta`` (``"250ms"`` or a number of seconds are accepted by the converters);
sizes are bytes (``"1MiB"`` is accepted).

The rebalance callbacks are fields too (``on_assign``, ``on_revoke``, ``on_lost``,
or a ``listener`` object with those methods), and so is the commit callback
``on_commit``; they are never read from the environment.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from sluice.client.rpc import MAX_MESSAGE_BYTES
from sluice.codec.filter import parse_filter
from sluice.common.names import validate_topic
from sluice.common.settings import convert_setting
from sluice.errors import InvalidArgument, SluiceError
from sluice.retry.levels import DEFAULT_DELAY_LEVELS, DEFAULT_MAX_RECONSUME_TIMES, parse_levels
from sluice.serde.builtin import DeserializerSpec, resolve_deserializer

__all__ = [
    "AUTO_OFFSET_RESETS",
    "COMMIT_MODES",
    "MAX_IN_FLIGHT_COMMITS",
    "MESSAGE_MODELS",
    "CommitCallback",
    "ConsumerConfig",
    "PartitionsCallback",
    "RebalanceListener",
    "subscription_of",
]

TopicPartition = tuple[str, int]
#: Called with the partitions concerned, sorted. The result is ignored (``object``: sluice.aio also
#: takes ``async def`` callbacks, whose coroutine it runs on its loop).
PartitionsCallback = Callable[[list[TopicPartition]], object]
#: ``callback(offsets, error)``: the offsets a commit carried and its first error (None: all stored).
CommitCallback = Callable[[dict[TopicPartition, int], SluiceError | None], object]

AUTO_OFFSET_RESETS = ("latest", "earliest", "none")
COMMIT_MODES = ("poll", "in-flight-min")
MESSAGE_MODELS = ("clustering", "broadcasting")
#: Upper bound of ``max_in_flight_commits``: more only loads the store (docs/consumer.md).
MAX_IN_FLIGHT_COMMITS = 16
ENV_PREFIX = "SLUICE_CONSUMER_"
# Room for the protobuf envelope of a fetch response.
_RESPONSE_OVERHEAD = 1024 * 1024
_CALLBACKS = ("on_assign", "on_revoke", "on_lost", "listener", "on_commit")
# A callable or a built-in's name (docs/serializers.md): checked by resolving, never converted.
_DESERIALIZERS = ("key_deserializer", "value_deserializer")
# The coordinator's accepted range for client-chosen timeouts.
_MIN_TIMEOUT = timedelta(milliseconds=100)
_MAX_TIMEOUT = timedelta(minutes=30)


class RebalanceListener(Protocol):
    """An object form of the callbacks; any method may be left out (duck-typed)."""

    def on_assign(self, partitions: list[TopicPartition]) -> None: ...

    def on_revoke(self, partitions: list[TopicPartition]) -> None: ...

    def on_lost(self, partitions: list[TopicPartition]) -> None: ...


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """Settings of one :class:`~sluice.client.consumer.Consumer`."""

    auto_offset_reset: str = "latest"
    """Where to start a partition that has no committed offset on its track, or whose
    position fell out of the log (OFFSET_OUT_OF_RANGE): ``latest`` (only new records),
    ``earliest`` (the log start) or ``none`` (``poll()`` raises OffsetOutOfRange)."""

    enable_auto_commit: bool = True
    """Commit in the background of ``poll()`` every ``auto_commit_interval``. Commits
    also happen on revoke and on ``close()`` whatever this says."""

    auto_commit_interval: timedelta = timedelta(seconds=5)
    """How often ``poll()`` commits asynchronously when ``enable_auto_commit``."""

    max_in_flight_commits: int = 1
    """How many asynchronous commits (``commit_async()`` and the auto-commit) may be in flight
    at once (sent and not answered, or waiting to be retried). Calls beyond it wait in one
    pending commit, where the latest offset of each partition wins. 1 (the default) keeps
    commits and their callbacks in call order; the one commit in flight carries everything
    processed while the previous one travelled."""

    commit_mode: str = "poll"
    """What counts as processed. ``poll`` (Kafka's rule): records returned by ``poll()``
    are in flight until the next ``poll()``. ``in-flight-min`` (RocketMQ's process-queue
    rule, for concurrent processing): a record is in flight until ``consumer.done(record)``,
    and a partition commits the smallest offset still in flight, never past an
    unfinished record."""

    instance_id: str = ""
    """Static membership: a member restarting with the same instance id within the
    session timeout gets its partitions back without a rebalance. ``close()`` leaves
    with epoch -2 (temporarily) instead of -1."""

    assignor: str = ""
    """Preferred assignor (``sticky``, ``range``, ``round-robin``, ``averagely``,
    ``averagely-by-circle``, ``consistent-hash``); empty: the group's default. The
    group config's assignor, when set, wins."""

    message_model: str = "clustering"
    """``clustering``: the group's members share the partitions. ``broadcasting``: every
    member reads every partition and keeps offsets of its own."""

    session_timeout: timedelta = timedelta(seconds=45)
    """A member silent for this long is removed and its partitions reassigned."""

    rebalance_timeout: timedelta = timedelta(seconds=60)
    """How long this member may take to release revoked partitions (finish processing,
    commit) before the coordinator fences it. Poll often enough to stay within it."""

    max_poll_records: int = 500
    """Upper bound on the records one ``poll()`` returns."""

    fetch_max_wait: timedelta = timedelta(milliseconds=500)
    """How long a broker may hold a fetch while waiting for ``fetch_min_bytes``."""

    fetch_min_bytes: int = 1
    """A broker answers a fetch as soon as this many bytes are ready."""

    fetch_max_bytes: int = 50 * 1024 * 1024
    """Upper bound on the bytes one fetch response carries (one whole batch may exceed it)."""

    partition_max_bytes: int = 1024 * 1024
    """Upper bound on the bytes per partition in one fetch response."""

    buffer_max_bytes: int = 32 * 1024 * 1024
    """The prefetch buffer's bound: while the records fetched but not yet returned by
    ``poll()`` hold this many bytes (values + 64 B per record), fetching pauses. The
    fetch round that crossed it still lands (per broker, at most two responses)."""

    request_timeout: timedelta = timedelta(seconds=30)
    """How long one heartbeat, commit or offset lookup RPC may take."""

    heartbeat_stream: bool = True
    """Heartbeat over one long-lived ``ConsumerGroupStream`` (cheaper for the coordinator,
    and it tells the member at once when a rebalance needs it). Falls back to the unary
    ``Heartbeat`` RPC by itself when the coordinator does not implement the stream;
    ``False`` always uses the unary RPC."""

    check_crcs: bool = True
    """Verify each fetched batch's CRC32C before decoding it."""

    retry: bool = False
    """Retry for this group (docs/retry.md): create ``RETRY.<group>`` and ``DLQ.<group>`` when missing,
    subscribe to the retry topic, hand retried records out when due, and allow
    ``reconsume_later(record)``. Off by default: it adds two topics and a subscription."""

    retry_delay_levels: str = DEFAULT_DELAY_LEVELS
    """The delay levels (RocketMQ's ``messageDelayLevel``), level 1 first; the first retry waits at
    level 3 and each further retry one level more. All members of a group should agree."""

    max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES
    """Retries before a record goes to ``DLQ.<group>`` (the next reconsume_later sends it there)."""

    retry_dedup_window: timedelta = timedelta(minutes=10)
    """How far back the retry and DLQ topics are read to skip a retry written by a process that
    crashed before committing the original (docs/retry.md, "No duplicate from a crash")."""

    orderly: bool = False
    """Ordered processing: ``reconsume_later`` is refused (ReconsumeRefused), since a retry reorders
    the partition; retry in place instead."""

    park_poison_keys: bool = False
    """Per-key poison parking (docs/poison-keys.md, "Pull consumers"): ``fail(record)`` parks the record's
    key in ``PARK.<group>``, later records of the key wait there in order, every other key flows."""

    max_redeliver: int = 3
    """Failures of a parked key's head before ``parked_policy`` applies (0 to 1000)."""

    parked_policy: str = "dlq"
    """``dlq``: the parked key's waiting records go to ``DLQ.<group>`` in order; ``hold``: they stay
    parked until ``sluice group unpark``."""

    park_max_messages: int = 10_000
    """A parked key with more records waiting goes to ``DLQ.<group>`` whatever the policy."""

    park_retry_delay: timedelta = timedelta(seconds=1)
    """How long a parked key's head waits before it is handed out again."""

    on_assign: PartitionsCallback | None = None
    """Called in ``poll()`` with partitions newly assigned, once their positions are known."""

    on_revoke: PartitionsCallback | None = None
    """Called in ``poll()`` with partitions taken away, after their offsets were committed
    and before they are released to their next owner."""

    on_lost: PartitionsCallback | None = None
    """Called in ``poll()`` with partitions lost without a chance to commit (this member
    was fenced or timed out: another member may already own them). Defaults to
    ``on_revoke``."""

    listener: Any = None
    """An object with ``on_assign`` / ``on_revoke`` / ``on_lost`` methods (any of them);
    used for the callbacks not given as functions."""

    on_commit: CommitCallback | None = None
    """``on_commit(offsets, error)``: the outcome of every auto-commit, of every
    ``commit_async()`` called without a callback, and of ``close()``'s final commit. Runs on
    the application's thread, inside ``poll()`` / ``commit()`` / ``commit_async()`` / ``close()``."""

    key_deserializer: DeserializerSpec = None
    """Turns each record's key into an object: a callable ``bytes -> obj`` or a built-in's name
    (``"str"``, ``"json"``, ``"bytes"``); an Avro or Protobuf deserializer object (docs/serializers.md).
    A key of None stays None. A record it fails on is raised as DeserializationError by ``poll()``,
    carrying the raw record; the next ``poll()`` goes on after it. None: keys are bytes."""

    value_deserializer: DeserializerSpec = None
    """Turns each record's value into an object, like ``key_deserializer``. None: values are bytes."""

    # A flat list of independent setting checks: one `if` per setting, no decision to split.
    def __post_init__(self) -> None:  # noqa: C901, PLR0912
        _check_types(self)
        if self.auto_offset_reset not in AUTO_OFFSET_RESETS:
            raise InvalidArgument(
                f"auto_offset_reset must be one of {', '.join(AUTO_OFFSET_RESETS)}, "
                f"got {self.auto_offset_reset!r}"
            )
        if self.commit_mode not in COMMIT_MODES:
            raise InvalidArgument(
                f"commit_mode must be one of {', '.join(COMMIT_MODES)}, got {self.commit_mode!r}"
            )
        if self.message_model not in MESSAGE_MODELS:
            raise InvalidArgument(
                f"message_model must be one of {', '.join(MESSAGE_MODELS)}, got {self.message_model!r}"
            )
        _check_retry(self)
        if self.auto_commit_interval <= timedelta(0):
            raise InvalidArgument(f"auto_commit_interval must be positive, got {self.auto_commit_interval}")
        for name in ("session_timeout", "rebalance_timeout"):
            value = getattr(self, name)
            if not _MIN_TIMEOUT <= value <= _MAX_TIMEOUT:
                raise InvalidArgument(f"{name} must be between 100ms and 30m, got {value}")
        if self.request_timeout <= timedelta(0):
            raise InvalidArgument(f"request_timeout must be positive, got {self.request_timeout}")
        if not timedelta(0) <= self.fetch_max_wait <= timedelta(seconds=60):
            raise InvalidArgument(f"fetch_max_wait must be between 0 and 60s, got {self.fetch_max_wait}")
        if self.max_poll_records < 1:
            raise InvalidArgument(f"max_poll_records must be >= 1, got {self.max_poll_records}")
        limit = MAX_MESSAGE_BYTES - _RESPONSE_OVERHEAD
        if not 0 <= self.fetch_min_bytes <= limit:
            raise InvalidArgument(f"fetch_min_bytes must be from 0 to {limit}, got {self.fetch_min_bytes}")
        for name in ("fetch_max_bytes", "partition_max_bytes"):
            if not 1 <= getattr(self, name) <= limit:
                raise InvalidArgument(f"{name} must be from 1 to {limit}, got {getattr(self, name)}")
        if not 1 <= self.max_in_flight_commits <= MAX_IN_FLIGHT_COMMITS:
            raise InvalidArgument(
                f"max_in_flight_commits must be from 1 to {MAX_IN_FLIGHT_COMMITS}, "
                f"got {self.max_in_flight_commits}"
            )
        if self.buffer_max_bytes < 1:
            raise InvalidArgument(f"buffer_max_bytes must be >= 1, got {self.buffer_max_bytes}")
        if len(self.instance_id) > 249:
            raise InvalidArgument("instance_id must be at most 249 characters")
        for name in ("on_assign", "on_revoke", "on_lost", "on_commit"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise InvalidArgument(f"{name} must be callable, got {getattr(self, name)!r}")

    # ---- callbacks -----------------------------------------------------------------

    def callback(self, name: str) -> PartitionsCallback | None:
        """The function for ``on_assign`` / ``on_revoke`` / ``on_lost`` (field, else listener
        method; ``on_lost`` falls back to ``on_revoke``)."""
        fn: PartitionsCallback | None = getattr(self, name)
        if fn is None and self.listener is not None:
            fn = getattr(self.listener, name, None)
        if fn is None and name == "on_lost":
            return self.callback("on_revoke")
        return fn

    # ---- converters ----------------------------------------------------------------

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ConsumerConfig:
        """Build from a mapping of field names to values or strings ('10ms', '1MiB')."""
        return cls().replace(**values)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ConsumerConfig:
        """Build from ``SLUICE_CONSUMER_<FIELD>`` variables (callbacks excluded)."""
        env = os.environ if env is None else env
        values = {
            f.name: env[ENV_PREFIX + f.name.upper()]
            for f in dataclasses.fields(cls)
            if f.name not in _CALLBACKS and ENV_PREFIX + f.name.upper() in env
        }
        return cls.from_dict(values)

    def replace(self, **overrides: Any) -> ConsumerConfig:
        """A copy with ``overrides`` converted and applied; unknown keys are rejected."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise InvalidArgument(
                f"unknown consumer setting(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}"
            )
        hints = _hints()
        converted = {k: _convert(k, hints[k], v) for k, v in overrides.items()}
        return dataclasses.replace(self, **converted)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    # ---- derived values ----------------------------------------------------------------

    @property
    def session_timeout_ms(self) -> int:
        return _ms(self.session_timeout)

    @property
    def rebalance_timeout_ms(self) -> int:
        return _ms(self.rebalance_timeout)

    @property
    def fetch_max_wait_ms(self) -> int:
        return _ms(self.fetch_max_wait)


def _ms(d: timedelta) -> int:
    return int(d.total_seconds() * 1000)


def _hints() -> dict[str, Any]:
    return typing.get_type_hints(ConsumerConfig)


def _convert(name: str, tp: Any, raw: Any) -> Any:
    if name in _CALLBACKS or name in _DESERIALIZERS:
        return raw
    return convert_setting("consumer", name, tp, raw)


def _check_retry(cfg: ConsumerConfig) -> None:
    parse_levels(cfg.retry_delay_levels)
    if not 1 <= cfg.max_reconsume_times <= 1000:
        raise InvalidArgument(
            f"max_reconsume_times must be between 1 and 1000, got {cfg.max_reconsume_times}"
        )
    if cfg.retry_dedup_window <= timedelta(0):
        raise InvalidArgument(f"retry_dedup_window must be positive, got {cfg.retry_dedup_window}")
    if not 0 <= cfg.max_redeliver <= 1000:
        raise InvalidArgument(f"max_redeliver must be between 0 and 1000, got {cfg.max_redeliver}")
    if not 1 <= cfg.park_max_messages <= 10_000_000:
        raise InvalidArgument(
            f"park_max_messages must be between 1 and 10000000, got {cfg.park_max_messages}"
        )
    if cfg.parked_policy not in ("dlq", "hold"):
        raise InvalidArgument(f"parked_policy must be dlq or hold, got {cfg.parked_policy!r}")
    if cfg.park_retry_delay < timedelta(0):
        raise InvalidArgument(f"park_retry_delay must not be negative, got {cfg.park_retry_delay}")
    if cfg.park_poison_keys and cfg.commit_mode != "poll":
        raise InvalidArgument(
            'park_poison_keys needs commit_mode="poll" (in-flight-min is not supported yet)'
        )


def _check_types(cfg: ConsumerConfig) -> None:
    for name, tp in _hints().items():
        if name in _CALLBACKS:
            continue
        if name in _DESERIALIZERS:
            resolve_deserializer(getattr(cfg, name), name)  # InvalidArgument for an unknown name or type
            continue
        value = getattr(cfg, name)
        if tp in (int, bool) and isinstance(value, bool) != (tp is bool):
            raise InvalidArgument(f"consumer setting {name} must be a {tp.__name__}, got {value!r}")
        if not isinstance(value, tp):
            raise InvalidArgument(f"consumer setting {name} must be a {tp.__name__}, got {value!r}")


def subscription_of(subscribe: Mapping[str, str] | Iterable[str] | str) -> dict[str, str]:
    """``client.consumer``'s ``subscribe`` as {topic: normalised filter}; topics and filters
    are checked here, before any RPC (InvalidTopic, InvalidFilter, InvalidArgument)."""
    if isinstance(subscribe, str):
        pairs: list[tuple[str, str]] = [(subscribe, "*")]
    elif isinstance(subscribe, Mapping):
        pairs = list(subscribe.items())
    else:
        pairs = [(t, "*") for t in subscribe]
    if not pairs:
        raise InvalidArgument("subscribe at least one topic")
    out: dict[str, str] = {}
    for topic, expr in pairs:
        validate_topic(topic)
        if not isinstance(expr, str):
            raise InvalidArgument(f"the filter of topic {topic!r} must be a string, got {expr!r}")
        if topic in out:
            raise InvalidArgument(f"topic {topic!r} is subscribed twice")
        out[topic] = parse_filter(expr).expression
    return out
