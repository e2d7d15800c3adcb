"""Talking to Sluice for the Spark source: offset resolution on the planner side,
range reads into Arrow on the executor side."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import TracebackType

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from sluice.client.client import Client
from sluice.client.fetcher import RawChunk
from sluice.codec.batch import NO_TAG, columns, decode_headers, iter_headers, read_tags
from sluice.codec.batch.compression import plain_batch
from sluice.errors import InvalidArgument, OffsetOutOfRange, UnknownTopicOrPartition
from sluice.spark.options import EARLIEST, LATEST, OffsetSpec, SourceOptions, parse_tp_key, tp_key
from sluice.spark.planning import OffsetRange

log = logging.getLogger(__name__)

#: Spark's Kafka source's columns, in its order and types (KafkaRecordToRowConverter.kafkaSchema:
#: key, value, topic, partition, offset, timestamp, timestampType, and with includeHeaders,
#: headers as array<struct<key:string,value:binary>>), then Sluice's own ``tag``. timestampType is
#: always 0 (CreateTime): Sluice keeps the producer's timestamp (docs/spark.md, "Schema").
_HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_FIELDS = [
    ("key", pa.binary(), "binary"),
    ("value", pa.binary(), "binary"),
    ("topic", pa.string(), "string"),
    ("partition", pa.int32(), "int"),
    ("offset", pa.int64(), "long"),
    ("timestamp", pa.timestamp("us", tz="UTC"), "timestamp"),
    ("timestampType", pa.int32(), "int"),
    ("headers", _HEADERS_TYPE, "array<struct<key:string,value:binary>>"),
    ("tag", pa.string(), "string"),
]
CREATE_TIME = 0


def arrow_schema(include_headers: bool) -> pa.Schema:
    return pa.schema([(n, t) for n, t, _ in _FIELDS if include_headers or n != "headers"])


def schema_ddl(include_headers: bool) -> str:
    return ", ".join(f"`{n}` {d}" for n, _, d in _FIELDS if include_headers or n != "headers")


SCHEMA_DDL = schema_ddl(include_headers=True)


class Planner:
    """Offset resolution against the live cluster (driver-side planning)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.client = Client(
            options.bootstrap,
            request_timeout=options.request_timeout_s,
            **options.client_kwargs(),
        )
        self._earliest: dict[str, int] | None = None

    def __enter__(self) -> Planner:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.client.close()

    def check_topics(self) -> dict[str, int]:
        """topic -> partition count; raises UnknownTopicOrPartition naming the missing topics."""
        meta = self.client.metadata(list(self.options.topics), refresh=True)
        counts = {t.name: len(t.partitions) for t in meta.topics.values() if t.name in self.options.topics}
        missing = [t for t in self.options.topics if t not in counts]
        if missing:
            raise UnknownTopicOrPartition(
                f"unknown topic(s) {', '.join(missing)} at {self.options.bootstrap}"
            )
        return counts

    def _list(self, spec: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for topic in self.check_topics():
            for p, off in self.client.list_offsets(topic, spec).items():
                out[tp_key(topic, p)] = off
        return out

    def earliest(self) -> dict[str, int]:
        if self._earliest is None:
            self._earliest = self._list(EARLIEST)
        return self._earliest

    def resolve(self, spec: OffsetSpec, at_least: dict[str, int] | None = None) -> dict[str, int]:
        """Turn a spec into explicit offsets for every partition of the topics."""
        if spec == EARLIEST:
            return self.earliest()
        latest = self._list(LATEST)
        if spec == LATEST:
            return latest
        assert isinstance(spec, dict)
        unknown = set(spec) - set(latest)
        if unknown:
            raise InvalidArgument(f"offsets given for unknown partitions: {', '.join(sorted(unknown))}")
        out = {}
        for key, hw in latest.items():
            want = spec.get(key, -2 if at_least is None else -1)
            if want == -2:
                want = self.earliest()[key]
            elif want == -1:
                want = hw
            if want > hw:
                raise InvalidArgument(f"offset {want} for {key} is beyond the high watermark {hw}")
            out[key] = self.checked_start(key, want, hw)
        if at_least is not None:
            bad = [k for k in out if out[k] < at_least.get(k, 0)]
            if bad:
                raise InvalidArgument(
                    f"endingOffsets are before startingOffsets for {', '.join(sorted(bad))}"
                )
        return out

    def resolve_start(self) -> dict[str, int]:
        """Where a query starts: startingOffsetsByTimestamp, else startingTimestamp, else
        startingOffsets (Kafka's precedence). A timestamp resolves per partition to the first
        offset whose record timestamp is >= it; with no such record, to the high watermark (the
        next record written). Partitions startingOffsetsByTimestamp does not name start as
        startingOffsets says."""
        o = self.options
        if o.starting_by_timestamp is not None:
            out = self.resolve(o.starting)
            unknown = set(o.starting_by_timestamp) - set(out)
            if unknown:
                raise InvalidArgument(
                    f"timestamps given for unknown partitions: {', '.join(sorted(unknown))}"
                )
            for key, ts in o.starting_by_timestamp.items():
                topic, p = parse_tp_key(key)
                out[key] = self.client.list_offsets(topic, ts, partitions=[p])[p]
            return out
        if o.starting_timestamp is not None:
            return {
                tp_key(topic, p): off
                for topic in self.check_topics()
                for p, off in self.client.list_offsets(topic, o.starting_timestamp).items()
            }
        return self.resolve(o.starting)

    def with_new_partitions(self, start: dict[str, int], latest: dict[str, int]) -> dict[str, int]:
        """Partitions added to a topic while the query runs are read from their earliest offset."""
        added = [k for k in latest if k not in start]
        if not added:
            return dict(start)
        earliest = self.earliest()
        return {**start, **{k: earliest[k] for k in added}}

    def checked_start(self, key: str, start: int | None, end: int) -> int:
        """The offset to start at, applying failOnDataLoss when retention removed data."""
        first = self.earliest()[key]
        if start is None:
            return first
        if start < first:
            msg = f"records {start}..{first - 1} of {key} were deleted by retention before Spark read them"
            if self.options.fail_on_data_loss:
                raise OffsetOutOfRange(msg + " (set failOnDataLoss=false to skip them)")
            log.warning("%s; skipping them (failOnDataLoss=false)", msg)
            return min(first, end)
        return start

    def range(self, key: str, start: int, end: int) -> OffsetRange:
        topic, partition = parse_tp_key(key)
        return OffsetRange(topic, partition, start, end)

    def commit_to_group(self, group: str, end: dict[str, int]) -> None:
        by_topic: dict[str, dict[int, int]] = {}
        for key, off in end.items():
            topic, p = parse_tp_key(key)
            by_topic.setdefault(topic, {})[p] = off
        for topic, offsets in by_topic.items():
            self.client.admin.set_group_offsets(group, topic, offsets)


def arrow_batches(chunk: RawChunk, end: int, include_headers: bool = True) -> Iterator[pa.RecordBatch]:
    """Arrow record batches for the records of ``chunk`` in [chunk.start, end).

    One broker batch becomes one Arrow batch with whole-column operations: the
    value and key columns are zero-copy views of the batch's data section (values
    are stored contiguously), offsets and timestamps are vector arithmetic on
    the batch's columns. Only a batch carrying record headers is walked per record.
    """
    for raw_pos, raw_h in iter_headers(chunk.data):
        if raw_h.next_offset <= chunk.start or raw_h.base_offset >= end:
            continue
        # A compressed batch is read as the plain batch it inflates to; the columns are views of that.
        buf, pos, h = plain_batch(chunk.data, raw_pos, raw_h)
        mv = memoryview(buf)
        tags = read_tags(buf, pos, h)
        c = columns(buf, pos, h)
        kp, vp, hp, dend = c.regions()
        n = h.record_count
        offsets = h.base_offset + np.frombuffer(c.offset_deltas, dtype=np.int32).astype(np.int64)
        klen = np.frombuffer(c.key_lengths, dtype=np.int32)
        has_key = klen >= 0
        cols = {
            "key": _binary(mv[kp:vp], np.where(has_key, klen, 0), None if has_key.all() else has_key),
            "value": _binary(mv[vp:hp], np.frombuffer(c.value_lengths, dtype=np.int32), None),
            "topic": pa.repeat(pa.scalar(chunk.topic, pa.string()), n),
            "partition": pa.repeat(pa.scalar(chunk.partition, pa.int32()), n),
            "offset": pa.array(offsets, pa.int64()),
            "timestamp": pa.array(
                (h.base_timestamp + np.frombuffer(c.timestamp_deltas, dtype=np.int64)) * 1000,
                pa.timestamp("us", tz="UTC"),
            ),
            "timestampType": pa.repeat(pa.scalar(CREATE_TIME, pa.int32()), n),
            "tag": _tags(tags, np.frombuffer(c.tag_indexes, dtype=np.uint16)),
        }
        if include_headers:
            cols["headers"] = _headers(mv[hp:dend], np.frombuffer(c.headers_lengths, dtype=np.int32))
        schema = arrow_schema(include_headers)
        batch = pa.RecordBatch.from_arrays([cols[name] for name in schema.names], schema=schema)
        keep = (offsets >= chunk.start) & (offsets < end)
        yield batch if keep.all() else batch.filter(pa.array(keep))


def _binary(
    data: memoryview, lengths: npt.NDArray[np.int32], valid: npt.NDArray[np.bool_] | None
) -> pa.Array:
    n = len(lengths)
    value_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=value_offsets[1:])
    validity = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(value_offsets), pa.py_buffer(data)])


def _tags(tags: tuple[str, ...], indexes: npt.NDArray[np.uint16]) -> pa.Array:
    if not tags:
        return pa.nulls(len(indexes), pa.string())
    missing = indexes == NO_TAG
    codes = pa.array(np.where(missing, 0, indexes).astype(np.int32), mask=missing)
    return pa.DictionaryArray.from_arrays(codes, pa.array(tags, pa.string())).cast(pa.string())


#: Bytes asked per fetch by an executor reading its offset range.
READ_CHUNK_BYTES = 16 * 1024 * 1024


def _headers(data: memoryview, lengths: npt.NDArray[np.int32]) -> pa.Array:
    n = len(lengths)
    if not lengths.any():  # the common case: no record has headers, all lists are empty
        empty = pa.StructArray.from_arrays(
            [pa.array([], pa.string()), pa.array([], pa.binary())], names=["key", "value"]
        )
        return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), empty).cast(_HEADERS_TYPE)
    rows: list[list[dict[str, object]]] = []
    p = 0
    for length in lengths.tolist():
        pairs = decode_headers(data[p : p + length]).items() if length else ()
        rows.append([{"key": k, "value": v} for k, v in pairs])
        p += length
    return pa.array(rows, _HEADERS_TYPE)


def read_range(r: OffsetRange, options: SourceOptions) -> Iterator[pa.RecordBatch]:
    """Read [start, end) of one partition with long-poll off; yield Arrow batches."""
    if r.size <= 0:
        return
    with Client(
        options.bootstrap, request_timeout=options.request_timeout_s, **options.client_kwargs()
    ) as client:
        fetcher = client.fetcher(
            {(r.topic, r.partition): r.start},
            filters={r.topic: options.filter},
            max_wait_ms=0,
            # A range read wants big answers: fewer round trips, larger Arrow batches.
            partition_max_bytes=READ_CHUNK_BYTES,
            max_bytes=READ_CHUNK_BYTES,
            auto_offset_reset="none",
        )
        try:
            stalled = 0
            while True:
                position = fetcher.positions()[(r.topic, r.partition)]
                if position >= r.end:
                    break
                chunks = fetcher.fetch_raw()
                moved = fetcher.positions()[(r.topic, r.partition)] != position
                stalled = 0 if moved or chunks else stalled + 1
                if stalled > 50:
                    raise OffsetOutOfRange(
                        f"{r.topic}/{r.partition} stopped at {position} before the planned end {r.end}"
                    )
                for chunk in chunks:
                    yield from arrow_batches(chunk, r.end, options.include_headers)
        finally:
            fetcher.close()
