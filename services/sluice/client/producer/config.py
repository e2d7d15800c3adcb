"""ProducerConfig: every producer setting in one typed, validated dataclass.

Build one with keywords, from a mapping (``ProducerConfig.from_dict``, e.g. a
TOML table) or from the environment (``SLUICE_PRODUCER_LINGER=10ms``), and
derive variants with :meth:`ProducerConfig.replace`. Unknown keys and bad
values are rejected with :class:`~sluice.errors.InvalidArgument` naming the key.
Durations are ``timedelta`` (strings such as ``"250ms"`` or numbers of seconds
are accepted by the converters); sizes are bytes (``"1MiB"`` is accepted).
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from sluice.client.rpc import MAX_MESSAGE_BYTES
from sluice.codec.batch.compression import codec_id
from sluice.common.settings import convert_setting
from sluice.errors import InvalidArgument
from sluice.serde.builtin import SerializerSpec, resolve_serializer

__all__ = ["PARTITIONERS", "ProducerConfig"]

#: Partitioner names accepted by ``ProducerConfig.partitioner``.
PARTITIONERS = ("default", "round_robin")
ENV_PREFIX = "SLUICE_PRODUCER_"
#: Batches of a partition in flight at most with idempotence: the broker keeps a producer's last five
#: batches per partition (``broker/log/producer_state.BATCHES_KEPT``), so a retry of any is recognised.
MAX_IN_FLIGHT_IDEMPOTENT = 5
# Callables (or a built-in's name): neither type-checked by isinstance nor converted from strings.
_SERIALIZERS = ("key_serializer", "value_serializer")
# Room for the protobuf envelope around the batches of one request.
_REQUEST_OVERHEAD = 64 * 1024


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """Settings of one :class:`~sluice.client.producer.Producer`."""

    linger: timedelta = timedelta(milliseconds=5)
    """How long a partition's batch waits for more records before it is sent. A full batch
    is sent at once; ``flush()`` and ``close()`` send every batch without waiting."""

    batch_size: int = 256 * 1024
    """Upper bound in bytes of one partition batch (header included). A record larger than
    this travels alone in a batch of its own. 256 KiB (about 2,000 records of 100 B): the
    per-batch costs are already spread thin, and every copy of a batch on its way (the broker's
    frame buffer and parse, a dispatcher's fetched answer, a consumer's) stays in the C heap,
    reused, instead of a fresh ``mmap`` each time; 1 MiB batches cost the servers 30-90 MB more
    peak RSS at no gain in CPU (docs/memory.md, "Producer batch size")."""

    max_request_size: int = 16 * 1024 * 1024
    """Upper bound in bytes of one Produce request (the batches of every partition sent to
    one broker together), and so of one record."""

    acks: int = -1
    """``-1`` (also given as ``"all"``, the default): a record is acknowledged once every in-sync
    replica of its partition holds it (docs/replication.md, "The durability contract"). 1: once the
    leader appended it (and fsynced it under the broker's ``flush=always``). 0: the broker answers
    before the append is durable."""

    enable_idempotence: bool | None = None
    """Number every batch per partition so that a retry after a lost answer is written once (the
    broker answers it with the first write's offsets). None (the default): on unless ``acks=0``, as in
    Kafka 3. It costs one ``InitProducerId`` call when the producer is created."""

    retries: int = 5
    """How many times a batch is sent again after a retriable error (a timeout, too few in-sync
    replicas) before its records fail. ``delivery_timeout`` bounds it too. A leader change (the broker
    unavailable, not the leader, a leader-epoch error) is retried until ``delivery_timeout`` without
    counting here: a failover must not reach the application."""

    retry_backoff: timedelta = timedelta(milliseconds=100)
    """Wait before the first retry of a batch; doubled on each further retry."""

    retry_backoff_max: timedelta = timedelta(seconds=5)
    """Cap of the doubling retry backoff."""

    delivery_timeout: timedelta = timedelta(seconds=120)
    """Upper bound on the time from ``send()`` until a record is acknowledged or failed,
    including lingering, waiting for a broker and retries."""

    request_timeout: timedelta = timedelta(seconds=30)
    """How long one Produce request may take before it counts as failed (and is retried)."""

    buffer_memory: int = 64 * 1024 * 1024
    """Bytes of closed batches waiting to be sent or acknowledged. When it is exceeded,
    ``send()`` blocks until batches complete, for at most ``max_block``."""

    max_block: timedelta = timedelta(seconds=60)
    """How long ``send()`` may block on a full buffer before it raises RequestTimedOut."""

    max_in_flight: int = 5
    """Produce requests in flight per broker, and with idempotence the batches in flight per
    partition (at most 5, Kafka's bound: the broker remembers a producer's last five batches,
    so any of them retried is recognised); sequence numbers keep a partition's order. Without
    idempotence a partition has one request in flight, so retries never reorder it."""

    partitioner: str = "default"
    """``default``: a record with a key goes to ``crc32(key) % partitions`` (zlib's CRC-32, so
    the same key always lands on the same partition); a record without a key goes to a
    sticky partition that changes whenever its batch is closed. ``round_robin``: keyless
    records rotate through the partitions one by one (keyed records still hash)."""

    max_delay: timedelta = timedelta(days=7)
    """The longest ``deliver_after`` (or ``deliver_at`` ahead of now) a delayed send accepts; a longer
    one raises DelayTooLong (docs/delayed-delivery.md)."""

    key_serializer: SerializerSpec = None
    """Turns ``send()``'s ``key`` into bytes: a callable ``obj -> bytes`` or a built-in's name (``"str"``,
    ``"json"``, ``"bytes"``); an Avro or Protobuf serializer object (docs/serializers.md). A key of None
    stays None. A failure raises SerializationError from ``send()``; nothing is queued. None: keys are
    bytes."""

    value_serializer: SerializerSpec = None
    """Turns ``send()``'s ``value`` into bytes, like ``key_serializer``. None: values are bytes."""

    tracing: bool = False
    """OpenTelemetry (the ``otel`` extra, docs/tracing.md): each ``send()`` opens a PRODUCER span that ends
    when the record is acknowledged or fails, and its context travels in the record's headers (W3C
    ``traceparent`` / ``tracestate``) for consumers' ``process_span``. Without OpenTelemetry installed,
    making the producer raises SerdeExtraMissing."""
    compression: str = "none"
    """The codec of each batch's records: ``"zstd"`` (recommended), ``"lz4"``, ``"gzip"`` or ``"none"``
    (docs/compression.md: the ratios and throughput measured, and why the default is ``"none"``). The
    batch header and tag table stay readable, so the broker still routes, validates and prunes filtered
    fetches; it stores and serves batches as sent. ``lz4`` needs ``pip install 'sluice[lz4]'``
    (UnsupportedCompression says so when its library is missing). ``batch_size`` counts the records'
    uncompressed bytes."""

    def __post_init__(self) -> None:
        if cast("object", self.acks) == "all":
            object.__setattr__(self, "acks", -1)
        _check_types(self)
        if self.linger < timedelta(0):
            raise InvalidArgument(f"linger must be >= 0, got {self.linger}")
        if self.batch_size < 1024:
            raise InvalidArgument(f"batch_size must be at least 1024 bytes, got {self.batch_size}")
        limit = MAX_MESSAGE_BYTES - _REQUEST_OVERHEAD
        if not self.batch_size <= self.max_request_size <= limit:
            raise InvalidArgument(
                f"max_request_size must be between batch_size ({self.batch_size}) and {limit} bytes, "
                f"got {self.max_request_size}"
            )
        if self.acks not in (-1, 0, 1):
            raise InvalidArgument(f"acks must be 0, 1 or 'all' (-1), got {self.acks}")
        if self.enable_idempotence and self.acks == 0:
            raise InvalidArgument(
                "enable_idempotence needs acks=1 or 'all': with acks=0 no answer tells a retry is needed"
            )
        if self.retries < 0:
            raise InvalidArgument(f"retries must be >= 0, got {self.retries}")
        for name in (
            "retry_backoff",
            "retry_backoff_max",
            "delivery_timeout",
            "request_timeout",
            "max_delay",
        ):
            if getattr(self, name) <= timedelta(0):
                raise InvalidArgument(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_block < timedelta(0):
            raise InvalidArgument(f"max_block must be >= 0, got {self.max_block}")
        if self.retry_backoff_max < self.retry_backoff:
            raise InvalidArgument("retry_backoff_max must be >= retry_backoff")
        if self.buffer_memory < self.batch_size:
            raise InvalidArgument(
                f"buffer_memory ({self.buffer_memory}) must be at least batch_size ({self.batch_size})"
            )
        self._check_max_in_flight()
        codec_id(self.compression)  # an unknown name or a missing library fails here, not at the first send
        if self.partitioner not in PARTITIONERS:
            raise InvalidArgument(
                f"unknown partitioner {self.partitioner!r}: choose one of {', '.join(PARTITIONERS)}"
            )

    def _check_max_in_flight(self) -> None:
        if self.max_in_flight < 1:
            raise InvalidArgument(f"max_in_flight must be >= 1, got {self.max_in_flight}")
        if self.idempotent and self.max_in_flight > MAX_IN_FLIGHT_IDEMPOTENT:
            raise InvalidArgument(
                f"max_in_flight must be at most {MAX_IN_FLIGHT_IDEMPOTENT} with idempotence (the broker "
                f"recognises a retry among a producer's last {MAX_IN_FLIGHT_IDEMPOTENT} batches), "
                f"got {self.max_in_flight}"
            )

    # ---- converters ----------------------------------------------------------------

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ProducerConfig:
        """Build from a mapping of field names to values or strings ('10ms', '1MiB')."""
        return cls().replace(**values)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ProducerConfig:
        """Build from ``SLUICE_PRODUCER_<FIELD>`` variables (e.g. SLUICE_PRODUCER_LINGER=10ms)."""
        env = os.environ if env is None else env
        values = {
            f.name: env[ENV_PREFIX + f.name.upper()]
            for f in dataclasses.fields(cls)
            if ENV_PREFIX + f.name.upper() in env
        }
        return cls.from_dict(values)

    def replace(self, **overrides: Any) -> ProducerConfig:
        """A copy with ``overrides`` converted and applied; unknown keys are rejected."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise InvalidArgument(
                f"unknown producer setting(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}"
            )
        hints = _hints()
        converted = {k: _convert(k, hints[k], v) for k, v in overrides.items()}
        return dataclasses.replace(self, **converted)

    @property
    def idempotent(self) -> bool:
        """Whether batches carry a producer id and sequences (``enable_idempotence``, resolved)."""
        return self.acks != 0 if self.enable_idempotence is None else self.enable_idempotence

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _hints() -> dict[str, Any]:
    return typing.get_type_hints(ProducerConfig)


def _convert(name: str, tp: Any, raw: Any) -> Any:
    if name == "acks" and isinstance(raw, str) and raw.strip().lower() == "all":
        return -1
    if name in _SERIALIZERS:
        return raw
    return convert_setting("producer", name, tp, raw)


def _check_types(cfg: ProducerConfig) -> None:
    for name, tp in _hints().items():
        if name in _SERIALIZERS:
            resolve_serializer(getattr(cfg, name), name)  # InvalidArgument for an unknown name or type
            continue
        value = getattr(cfg, name)
        if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidArgument(f"producer setting {name} must be an int, got {value!r}")
        if tp is not int and not isinstance(value, tp):
            kind = getattr(tp, "__name__", str(tp))
            raise InvalidArgument(f"producer setting {name} must be a {kind}, got {value!r}")
