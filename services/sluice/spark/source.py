"""The ``sluice`` PySpark data source: batch and micro-batch streaming reads.

Planning (offset resolution, splits, read limits) talks to the coordinator and
brokers through the SDK; executors read their ranges with the SDK's fetcher,
long-poll off, and hand Spark Arrow record batches, never per-row tuples.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from sluice.spark.epochs import check_truncation, join_offsets, leader_epochs, split_offsets
from sluice.spark.options import SourceOptions, _bool, parse_options
from sluice.spark.planning import OffsetRange, limit_offsets, split, split_min_partitions
from sluice.spark.reading import Planner, read_range, schema_ddl
from sluice.spark.sink import SluiceBatchWriter, SluiceStreamWriter, parse_sink_options

log = logging.getLogger(__name__)


class RangePartition(InputPartition):
    """One input partition: a topic-partition offset range plus what the executor needs."""

    def __init__(self, r: OffsetRange, options: SourceOptions) -> None:
        super().__init__((r.topic, r.partition, r.start, r.end))
        self.range = r
        self.options = options


class SluiceDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "sluice"

    def schema(self) -> str:
        # Kafka's columns; ``headers`` only with includeHeaders=true, as in Kafka's source.
        return schema_ddl(_bool("includeHeaders", self.options.get("includeheaders"), False))

    def reader(self, schema: StructType) -> DataSourceReader:
        return SluiceBatchReader(parse_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return SluiceStreamReader(parse_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return SluiceBatchWriter(parse_sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return SluiceStreamWriter(parse_sink_options(self.options), schema)


class SluiceBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        # Resolve at construction so bad topics or an unreachable bootstrap fail
        # while Spark plans the query, not inside a task.
        with Planner(options) as planner:
            start = planner.resolve_start()
            end = planner.resolve(options.ending, at_least=start)
        self.ranges = split_min_partitions(
            [
                piece
                for key in sorted(end)
                for piece in split(
                    planner.range(key, start[key], end[key]), options.max_records_per_partition
                )
            ],
            options.min_partitions,
        )

    def partitions(self) -> Sequence[InputPartition]:
        return [RangePartition(r, self.options) for r in self.ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        yield from read_range(partition.range, partition.options)


class SluiceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"topic/partition": {"offset": next_offset, "leaderEpoch": epoch}}`` (``epochs.py``;
    a plain ``next_offset``, as checkpoints before leader epochs hold, loads too)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: dict[str, int] | None = None
        #: Truncations found by the leader-epoch check (failOnDataLoss=false), each counted once.
        self.truncations = 0
        self._seen: set[tuple[str, int, int]] = set()
        with Planner(options) as planner:
            planner.check_topics()

    def initialOffset(self) -> dict[str, Any]:
        with Planner(self.options) as planner:
            start = planner.resolve_start()
            return join_offsets(start, leader_epochs(planner.client, start))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger is not None:
            return ReadMaxRows(self.options.max_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        with Planner(self.options) as planner:
            self._target = planner.resolve("latest")

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        with Planner(self.options) as planner:
            begin = self._checked(planner, start)
            latest = planner.resolve("latest")
            epochs = leader_epochs(planner.client, latest)
            begin = planner.with_new_partitions(begin, latest)
        if self._target is not None:
            # AvailableNow: never read past what existed when the query started;
            # partitions added since are read up to their start.
            latest = {k: min(v, self._target.get(k, begin[k])) for k, v in latest.items()}
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return join_offsets(limit_offsets(begin, latest, max_rows), epochs)

    def reportLatestOffset(self) -> dict[str, int] | None:
        # Plain offsets: only shown in the progress (never planned from), so no epoch to check.
        with Planner(self.options) as planner:
            return planner.resolve("latest")

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        ends, _ = split_offsets(end)
        with Planner(self.options) as planner:
            begin = self._checked(planner, start)
            ranges = []
            for key in sorted(ends):
                first = planner.checked_start(key, begin.get(key), ends[key])
                ranges += split(planner.range(key, first, ends[key]), self.options.max_records_per_partition)
        return [
            RangePartition(r, self.options) for r in split_min_partitions(ranges, self.options.min_partitions)
        ]

    def _checked(self, planner: Planner, start: dict[str, Any]) -> dict[str, int]:
        """The start offsets, checked with the current leaders (KIP-320; ``epochs.check_truncation``)."""
        offsets, epochs = split_offsets(start)
        checked, found = check_truncation(planner.client, offsets, epochs, self.options.fail_on_data_loss)
        for t in found:
            if t not in self._seen:  # latestOffset and partitions check the same start
                self._seen.add(t)
                self.truncations += 1
        return checked

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        yield from read_range(partition.range, partition.options)

    def commit(self, end: dict[str, Any]) -> None:
        # Spark calls this for a micro-batch when it runs the next one, so a group's offsets
        # trail the query by one batch; the checkpoint stays the source of truth.
        if self.options.commit_to_group is None:
            return
        with Planner(self.options) as planner:
            try:
                planner.commit_to_group(self.options.commit_to_group, split_offsets(end)[0])
            except Exception as exc:
                log.warning(
                    "could not commit Spark progress to group %s: %s", self.options.commit_to_group, exc
                )

    def stop(self) -> None:
        return None
