"""The ``sluice`` Spark sink: ``df.write.format("sluice")`` and ``df.writeStream.format("sluice")``.

Columns, as Spark's Kafka sink takes them (docs/spark.md, "Sink"): ``value`` (binary or string,
required), ``key`` (binary or string), ``topic`` (string; the ``topic`` option, when given, wins),
``partition`` (int; null: the producer's partitioner), ``headers`` (``array<struct<key:string,
value:binary>>`` as the source reads them, or ``map<string,binary>``), plus Sluice's ``tag``
(string) and ``timestamp`` (the record's timestamp; null: now). Other columns are ignored, so a
DataFrame read with the source can be written back as it is.

Each Spark task writes its rows with one idempotent producer per topic (``acks=all`` unless the
``acks`` option says 1): a batch the producer retries after a lost answer is written once. A Spark
task *retry* (a failed or speculative attempt run again) is a new producer: what the failed
attempt had written stays and is written again, so the sink is at-least-once across task retries
and micro-batch replays, exactly once only within one attempt's producer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    MapType,
    Row,
    StringType,
    StructType,
    TimestampType,
)

from sluice.client.client import Client
from sluice.codec.batch.compression import codec_id
from sluice.common.client_security import TLSConfig
from sluice.common.names import validate_topic
from sluice.errors import InvalidArgument
from sluice.spark.options import _credentials, _positive, _tls

log = logging.getLogger(__name__)

KNOWN = {
    "bootstrap", "topic", "path", "acks", "requesttimeoutms", "compression",
    "tlsca", "tlscert", "tlskey", "tlsservername", "token", "tokenfile", "username", "password",
    # The source's options are accepted and ignored, so one options dict serves a copy job;
    # Spark hands a stream writer the query's checkpointLocation.
    "includeheaders", "checkpointlocation",
}  # fmt: skip
#: Futures kept before waiting for the oldest: bounds the memory a task holds for its answers.
MAX_PENDING = 20_000

_HEADER_ARRAY = ArrayType(StructType().add("key", StringType()).add("value", BinaryType()))
_COLUMN_TYPES: dict[str, tuple[DataType, ...]] = {
    "value": (BinaryType(), StringType()),
    "key": (BinaryType(), StringType()),
    "topic": (StringType(),),
    "partition": (IntegerType(),),
    "headers": (_HEADER_ARRAY, MapType(StringType(), BinaryType())),
    "tag": (StringType(),),
    "timestamp": (TimestampType(),),
}


@dataclass(frozen=True)
class SinkOptions:
    bootstrap: str
    topic: str | None
    acks: int
    request_timeout_s: float
    compression: str = "none"
    tls: TLSConfig | None = None
    token: str | None = None
    token_file: str | None = None
    username: str | None = None
    password: str | None = None

    def client_kwargs(self) -> dict[str, Any]:
        return {
            "tls": self.tls,
            "token": self.token,
            "token_file": self.token_file,
            "username": self.username,
            "password": self.password,
        }

    def __repr__(self) -> str:  # Spark logs plans: never the password or the token
        return f"SinkOptions(bootstrap={self.bootstrap!r}, topic={self.topic!r}, acks={self.acks})"


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    opts = {k.lower(): v for k, v in options.items()}
    unknown = set(opts) - KNOWN
    if unknown:
        raise InvalidArgument(f"unknown option(s) for the sluice sink: {', '.join(sorted(unknown))}")
    bootstrap = opts.get("bootstrap", "").strip()
    if not bootstrap:
        raise InvalidArgument("option bootstrap is required (the coordinator address, e.g. 127.0.0.1:7600)")
    topic = (opts.get("topic") or opts.get("path") or "").strip() or None
    if topic is not None:
        validate_topic(topic)
    acks_raw = opts.get("acks", "all").strip().lower()
    if acks_raw not in ("all", "-1", "1"):
        raise InvalidArgument(
            f"option acks: {acks_raw!r} is not 'all' or 1 (the sink's producer is idempotent)"
        )
    timeout_ms = _positive("requestTimeoutMs", opts.get("requesttimeoutms")) or 30_000
    compression = opts.get("compression", "none").strip().lower()
    codec_id(compression)  # on the driver: an unknown codec, or one whose library is missing, fails here
    return SinkOptions(
        bootstrap=bootstrap,
        topic=topic,
        acks=1 if acks_raw == "1" else -1,
        request_timeout_s=timeout_ms / 1000,
        compression=compression,
        tls=_tls(opts),
        **_credentials(opts),
    )


def check_schema(schema: StructType, options: SinkOptions) -> None:
    """Fail on the driver, naming the column, before any task writes anything."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise InvalidArgument("the sluice sink needs a 'value' column (binary or string)")
    if options.topic is None and "topic" not in fields:
        raise InvalidArgument("the sluice sink needs the 'topic' option or a 'topic' column")
    for name, allowed in _COLUMN_TYPES.items():
        if name in fields and fields[name] not in allowed:
            kinds = " or ".join(t.simpleString() for t in allowed)
            raise InvalidArgument(
                f"sluice sink: column {name!r} is {fields[name].simpleString()}, expected {kinds}"
            )


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task wrote: its record count (summed on the driver and logged)."""

    records: int


def _bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    return value.encode() if isinstance(value, str) else bytes(value)


def _headers(value: Any) -> dict[str, bytes] | None:
    if not value:
        return None
    pairs = value.items() if isinstance(value, dict) else ((h["key"], h["value"]) for h in value)
    # Sluice's record headers are a map: a repeated key keeps its last value.
    return {str(k): bytes(v) if v is not None else b"" for k, v in pairs}


def _millis(ts: datetime | None) -> int | None:
    return None if ts is None else int(ts.timestamp() * 1000)


def write_rows(rows: Iterator[Row], options: SinkOptions) -> SinkCommit:
    """Send every row; return once every one is acknowledged (or raise, failing the task)."""
    count = 0
    with Client(
        options.bootstrap, request_timeout=options.request_timeout_s, **options.client_kwargs()
    ) as client:
        producers: dict[str, Any] = {}
        pending: list[Any] = []
        try:
            for row in rows:
                d = row.asDict()
                topic = options.topic or d.get("topic")
                if not topic:
                    raise InvalidArgument("sluice sink: a row has a null 'topic' and no topic option is set")
                producer = producers.get(topic)
                if producer is None:
                    producer = client.producer(
                        topic, acks=options.acks, enable_idempotence=True, compression=options.compression
                    )
                    producers[topic] = producer
                value = _bytes(d["value"])
                if value is None:
                    raise InvalidArgument(f"sluice sink: a row for {topic} has a null 'value'")
                pending.append(
                    producer.send(
                        value,
                        key=_bytes(d.get("key")),
                        tag=d.get("tag"),
                        headers=_headers(d.get("headers")),
                        partition=d.get("partition"),
                        timestamp=_millis(d.get("timestamp")),
                    )
                )
                count += 1
                if len(pending) >= MAX_PENDING:
                    for future in pending:
                        future.result()
                    pending.clear()
            for producer in producers.values():
                producer.flush()
            for future in pending:
                future.result()
        finally:
            for producer in producers.values():
                producer.close()
    return SinkCommit(count)


def _total(messages: list[WriterCommitMessage | None]) -> int:
    return sum(m.records for m in messages if isinstance(m, SinkCommit))


class SluiceBatchWriter(DataSourceWriter):
    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        check_schema(schema, options)
        self.options = options

    def write(self, iterator: Iterator[Row]) -> SinkCommit:
        return write_rows(iterator, self.options)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("sluice sink: %d records written", _total(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Not transactional: what the successful tasks wrote is in the log and stays there.
        log.warning("sluice sink: job aborted after %d records were written", _total(messages))


class SluiceStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        check_schema(schema, options)
        self.options = options

    def write(self, iterator: Iterator[Row]) -> SinkCommit:
        return write_rows(iterator, self.options)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("sluice sink: micro-batch %d wrote %d records", batchId, _total(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # The batch is replayed from the checkpoint: its records are written again (at-least-once).
        log.warning("sluice sink: micro-batch %d aborted after %d records", batchId, _total(messages))
