"""Deduplication at a retry / DLQ / redrive target by the source coordinates its records carry.

A retried record carries ``sluice-retry-source: topic/partition/offset`` (a redriven one
``sluice-redrive-source``): the record it was made from. Before writing, the writer asks this index
whether the target partition already holds a record with that source, and skips the write if so. That is
what makes a crash between "written" and "original committed" (or "redrive cursor saved") harmless: the
next incarnation re-reads the target's tail, finds its predecessor's write and does not repeat it.

The idempotent producer cannot do this: its producer id dies with the process, and the next process's
write is a new record to the broker (docs/retry.md, "No duplicate from a crash").

The index reads the target partition from ``window`` ago (ListOffsets by timestamp) on first use, then
only the records appended since (one ListOffsets per lookup, a fetch only when the end moved), so writes
by other members of the group are seen as well. A crash is deduplicated when the source is re-processed
within ``window`` of the first write (default 10 minutes: a session timeout and a restart fit many times).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Protocol

from sluice.codec.batch import Record
from sluice.errors import RequestTimedOut

__all__ = ["FetcherLike", "SourceIndex"]

TopicPartition = tuple[str, int]
#: Keys kept per partition; the oldest go first beyond it (they are older than any crash window).
MAX_KEYS = 1_000_000


class FetcherLike(Protocol):
    def fetch(self, timeout: float | None = None) -> list[Record]: ...
    def positions(self) -> dict[TopicPartition, int]: ...
    def close(self) -> None: ...


class ListOffsets(Protocol):
    def __call__(self, topic: str, spec: str | int, partitions: Iterable[int]) -> dict[int, int]: ...


class SourceIndex:
    """Source keys (a header's values) of the recent records of some partitions."""

    def __init__(
        self,
        list_offsets: ListOffsets,
        make_fetcher: Callable[[Mapping[TopicPartition, int]], FetcherLike],
        header: str,
        window: timedelta,
        timeout: float = 30.0,
    ) -> None:
        self._list_offsets = list_offsets
        self._make_fetcher = make_fetcher
        self._header = header
        self._window_ms = int(window.total_seconds() * 1000)
        self._timeout = timeout
        self._seen: dict[TopicPartition, dict[str, None]] = {}
        self._pos: dict[TopicPartition, int] = {}
        #: The highest source offset per source partition over every key seen: a record above it was
        #: never retried, so most records need no lookup at all.
        self.max_source: dict[TopicPartition, int] = {}
        self._all: dict[str, None] = {}

    def contains(self, tp: TopicPartition, key: str) -> bool:
        """Whether ``tp`` holds a record whose source is ``key`` (reads what was appended since)."""
        self.catch_up(tp)
        return key in self._seen[tp]

    def add(self, tp: TopicPartition, key: str) -> None:
        keys = self._seen.setdefault(tp, {})
        keys[key] = None
        if len(keys) > MAX_KEYS:
            del keys[next(iter(keys))]
        self._all[key] = None
        if len(self._all) > MAX_KEYS:
            del self._all[next(iter(self._all))]
        topic, _, rest = key.rpartition("/")
        topic, _, partition = topic.rpartition("/")
        if rest.isdigit() and partition.isdigit():
            src = (topic, int(partition))
            if int(rest) > self.max_source.get(src, -1):
                self.max_source[src] = int(rest)

    def seen(self, key: str) -> bool:
        """Whether any partition read so far holds ``key`` (no reading)."""
        return key in self._all

    def catch_up(self, tp: TopicPartition) -> None:
        topic, partition = tp
        end = self._list_offsets(topic, "latest", [partition])[partition]
        start = self._pos.get(tp)
        if start is None:
            since = int(time.time() * 1000) - self._window_ms
            start = self._list_offsets(topic, max(since, 0), [partition])[partition]
            self._seen.setdefault(tp, {})
        if start < end:
            self._read(tp, start, end)
        self._pos[tp] = max(end, start)

    def _read(self, tp: TopicPartition, start: int, end: int) -> None:
        fetcher = self._make_fetcher({tp: start})
        deadline = time.monotonic() + self._timeout
        header = self._header
        try:
            while fetcher.positions()[tp] < end:
                if time.monotonic() > deadline:
                    raise RequestTimedOut(
                        f"reading {tp[0]}[{tp[1]}] {start}..{end} to deduplicate took "
                        f"over {self._timeout:.0f}s"
                    )
                for r in fetcher.fetch(0.5):
                    if r.headers:
                        key = r.headers.get(header)
                        if key is not None:
                            self.add(tp, key.decode("utf-8", "replace"))
        finally:
            fetcher.close()
