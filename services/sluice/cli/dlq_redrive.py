"""The DLQ redrive: move dead letters back, throttled, resumable, each record exactly once (docs/retry.md).

A redrive reads a dead-letter topic from its cursor and writes each record to its target:

- a pull group's ``DLQ.<group>``: ``retry`` (default) is ``RETRY.<group>`` partition 0, due at once,
  so only the group that failed sees it again, with a full retry cycle (reconsume count back to 0);
- a push subscription's ``<topic>.<sub>.DLQ``: ``redelivery`` (default) is ``<topic>.<sub>.REDRIVE``,
  which only the subscription ``<sub>`` of that topic reads;
- ``original`` (either): the partition it first came from, so every group of that topic sees it.

Each written record keeps its headers (original coordinates, first failure), gets
``sluice-redrive-count`` raised by one and ``sluice-redrive-source: DLQ.<group>/<partition>/<offset>``.
A record already redriven ``cap`` times stays in the DLQ (counted as kept).

**Exactly once across a crash.** Work goes in batches: write the batch, wait for every acknowledgement,
then save the cursor (the DLQ offset after the batch) and then the targets' end offsets, both in the
offset store as the committed offsets of the group ``redrive.<group>`` (``redrive-sub.<topic>.<sub>``
for a subscription; a group with no members, so
``set_group_offsets`` may write it). On start, the targets are read from the saved end offsets to their
current end and every ``sluice-redrive-source`` found is skipped: a process killed between a write's
acknowledgement and the cursor save left exactly those records, so nothing is written twice; nothing
is lost because the cursor never passes a record before its write was acknowledged. The cursor is
saved before the target offsets, so a crash between the two only makes the next start read more.
The idempotent producer alone would not do: its producer id dies with the process.

One redrive per DLQ at a time: two concurrent ones would not see each other's writes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sluice.codec.batch import Record
from sluice.errors import InvalidArgument, RequestTimedOut, TopicAlreadyExists, UnknownTopicOrPartition
from sluice.retry.levels import (
    DLQ_PREFIX,
    H_COUNT,
    H_DLQ_SOURCE,
    H_DUE,
    H_PARTITION,
    H_REDRIVE_COUNT,
    H_SOURCE,
    H_TOPIC,
    check_sub_redrive_names,
    dlq_group,
    redrive_topic,
    retry_topic,
    source_key,
    sub_dlq_topic,
)

__all__ = [
    "DEFAULT_CAP",
    "RedriveOptions",
    "RedriveProgress",
    "Redriver",
    "cursor_group",
    "cursor_of",
    "redelivery_of",
]

DEFAULT_CAP = 3
BATCH = 500
#: Fault injection for the crash tests: kill -9 this process after the write of the batch holding this
#: many records was acknowledged and before the cursor is saved.
CRASH_ENV = "SLUICE_REDRIVE_CRASH_AFTER"

TopicPartition = tuple[str, int]


def cursor_group(group: str) -> str:
    return f"redrive.{group}"


def cursor_of(dlq: str) -> str:
    """The cursor group of a dead-letter topic: ``redrive.<group>`` for ``DLQ.<group>``,
    ``redrive-sub.<topic>.<sub>`` for a subscription's ``<topic>.<sub>.DLQ`` (a prefix of its own, so
    a group named ``<topic>.<sub>`` cannot share it)."""
    if dlq.startswith(DLQ_PREFIX):
        return cursor_group(dlq_group(dlq))
    return "redrive-sub." + dlq.removesuffix(".DLQ")


@dataclass
class RedriveOptions:
    dlq: str
    #: ``retry`` for a group's DLQ, ``redelivery`` for a subscription's, or ``original``.
    to: str = "retry"
    #: A push subscription's DLQ: its topic and subscription (``dlq`` is then ``<topic>.<sub>.DLQ``).
    topic: str = ""
    subscription: str = ""
    tag_filter: str = "*"
    rate: float = 0.0  # records per second; 0: unthrottled
    cap: int = DEFAULT_CAP
    dry_run: bool = False
    batch: int = BATCH


def redelivery_of(options: RedriveOptions) -> str:
    """The topic only the failed group or subscription reads (the default target); checks the options
    without I/O: InvalidArgument (NotADlqTopic) naming what is wrong."""
    if options.subscription:
        check_sub_redrive_names(options.topic, options.subscription)
        if options.dlq != sub_dlq_topic(options.topic, options.subscription):
            raise InvalidArgument(f"{options.dlq!r} is not the DLQ of {options.subscription!r}")
        own, topic = "redelivery", redrive_topic(options.topic, options.subscription)
    else:
        own, topic = "retry", retry_topic(dlq_group(options.dlq))  # NotADlqTopic for any other topic
    if options.to not in (own, "original"):
        raise InvalidArgument(f"--to must be {own} or original for {options.dlq}, got {options.to!r}")
    if options.rate < 0 or options.cap < 1 or options.batch < 1:
        raise InvalidArgument("--rate must be >= 0, --cap and the batch size >= 1")
    return topic


@dataclass
class RedriveProgress:
    total: int = 0  # DLQ records from the cursor to the end at the start
    read: int = 0
    redriven: int = 0
    deduplicated: int = 0
    kept: int = 0  # over the cap
    filtered: int = 0
    targets: dict[TopicPartition, int] = field(default_factory=dict)


class Redriver:
    def __init__(
        self, client: Any, options: RedriveOptions, report: Callable[[RedriveProgress], None]
    ) -> None:
        self.client = client
        self.opts = options
        self.redelivery = redelivery_of(options)
        self.cursor_name = cursor_of(options.dlq)
        # Here, not at the top: the filter module loads the SQL grammar (lark), which `sluice --help`
        # and the other sub-commands do not need.
        from sluice.codec.filter import parse_filter

        self.filter = parse_filter(options.tag_filter)
        if options.rate > 0:  # a batch is at most a second of the rate: no bursts of 500 at 10/s
            options.batch = min(options.batch, max(1, int(options.rate)))
        self.report = report
        self.progress = RedriveProgress()
        self._crash_after = int(os.environ.get(CRASH_ENV, "0") or 0)
        self._seen: set[str] = set()
        self._producers: dict[str, Any] = {}

    # ---- cursor --------------------------------------------------------------------------------

    def cursor(self) -> dict[int, int]:
        """{DLQ partition: next offset to redrive} (the log start where nothing is saved)."""
        start = self.client.list_offsets(self.opts.dlq, "earliest")
        saved = self.client.admin.group_offsets(self.cursor_name)
        return {p: max(saved.get((self.opts.dlq, p), off), off) for p, off in start.items()}

    def _save(self, positions: dict[int, int]) -> None:
        admin = self.client.admin
        admin.set_group_offsets(self.cursor_name, self.opts.dlq, positions)
        by_topic: dict[str, dict[int, int]] = {}
        for (topic, p), _ in self.progress.targets.items():
            by_topic.setdefault(topic, {})[p] = self.client.list_offsets(topic, "latest", [p])[p]
        for topic, ends in by_topic.items():
            admin.set_group_offsets(self.cursor_name, topic, ends)

    def _mark_target(self, topic: str, partition: int) -> None:
        """Before the first write to a target partition in this run: save its end unless an earlier
        run saved one, so that a crash before the first cursor save is deduplicated too."""
        saved = self.client.admin.group_offsets(self.cursor_name, [(topic, partition)])
        if (topic, partition) not in saved:
            end = self.client.list_offsets(topic, "latest", [partition])[partition]
            self.client.admin.set_group_offsets(self.cursor_name, topic, {partition: end})
        self.progress.targets[(topic, partition)] = 0

    # ---- dedup at the targets ------------------------------------------------------------------

    def _load_seen(self) -> None:
        """The redrive sources written since the last saved target offsets (a crashed run's writes)."""
        saved = self.client.admin.group_offsets(self.cursor_name)
        for (topic, p), start in saved.items():
            if topic == self.opts.dlq:
                continue
            end = self.client.list_offsets(topic, "latest", [p])[p]
            for r in _read(self.client, (topic, p), start, end):
                src = (r.headers or {}).get(H_DLQ_SOURCE)
                if src is not None and src.decode("utf-8", "replace").startswith(self.opts.dlq + "/"):
                    self._seen.add(src.decode())

    # ---- the run -------------------------------------------------------------------------------

    def run(self) -> RedriveProgress:
        try:
            self.client.admin.describe_topic(self.opts.dlq)
        except UnknownTopicOrPartition:
            raise UnknownTopicOrPartition(f"dead-letter topic {self.opts.dlq!r} does not exist") from None
        if self.opts.to == "redelivery" and not self.opts.dry_run:
            self._ensure_redelivery_topic()
        positions = self.cursor()
        ends = self.client.list_offsets(self.opts.dlq, "latest")
        self.progress.total = sum(max(ends[p] - positions[p], 0) for p in ends)
        if not self.opts.dry_run:
            self._load_seen()
        started = time.monotonic()
        for p in sorted(ends):
            if positions[p] >= ends[p]:
                continue
            batch: list[Record] = []
            for r in _read(self.client, (self.opts.dlq, p), positions[p], ends[p]):
                batch.append(r)
                if len(batch) >= self.opts.batch:
                    positions[p] = self._batch(batch, positions, p, started)
                    batch = []
            if batch:
                positions[p] = self._batch(batch, positions, p, started)
        self.report(self.progress)
        for producer in self._producers.values():
            producer.close()
        return self.progress

    def _ensure_redelivery_topic(self) -> None:
        """A subscription's redrive topic is made by its first redrive (one partition: the DLQ has one)."""
        try:
            self.client.admin.describe_topic(self.redelivery)
        except UnknownTopicOrPartition:
            with contextlib.suppress(TopicAlreadyExists):  # made meanwhile by another tool: fine
                self.client.admin.create_topic(self.redelivery, partitions=1)

    def _batch(self, batch: list[Record], positions: dict[int, int], p: int, started: float) -> int:
        pending = []
        for r in batch:
            self.progress.read += 1
            out = self._redriven(r)
            if out is None:
                continue
            topic, partition, headers = out
            if not self.opts.dry_run:
                if (topic, partition) not in self.progress.targets:
                    self._mark_target(topic, partition)
                producer = self._producer(topic)
                pending.append(
                    producer.send(r.value, key=r.key, tag=r.tag, headers=headers, partition=partition)
                )
                self._seen.add(headers[H_DLQ_SOURCE].decode())
            self.progress.redriven += 1
        for future in pending:
            future.result(60)
        if self._crash_after and self.progress.read >= self._crash_after:
            os.kill(os.getpid(), signal.SIGKILL)  # acknowledged, cursor not saved: the test's crash
        next_offset = batch[-1].offset + 1
        if not self.opts.dry_run:
            self._save({**positions, p: next_offset})
        self.report(self.progress)
        self._throttle(started)
        return next_offset

    def _redriven(self, r: Record) -> tuple[str, int, dict[str, bytes]] | None:
        """(topic, partition, headers) of the record's redrive, None to leave it (counted)."""
        headers = dict(r.headers) if r.headers else {}
        if not self.filter.matches(r.tag):
            self.progress.filtered += 1
            return None
        count = int(headers.get(H_REDRIVE_COUNT, b"0") or 0)
        if count >= self.opts.cap:
            self.progress.kept += 1
            return None
        key = source_key(self.opts.dlq, r.partition, r.offset)
        if key in self._seen:
            self.progress.deduplicated += 1
            return None
        headers[H_REDRIVE_COUNT] = str(count + 1).encode()
        headers[H_DLQ_SOURCE] = key.encode()
        headers[H_SOURCE] = key.encode()
        if self.opts.to == "retry":
            headers[H_COUNT] = b"0"  # a full retry cycle again
            headers[H_DUE] = b"0"  # due at once
            return self.redelivery, 0, headers
        if self.opts.to == "redelivery":
            headers.pop(H_DUE, None)
            return self.redelivery, 0, headers
        topic = headers.get(H_TOPIC)
        if topic is None:
            own = "redelivery" if self.opts.subscription else "retry"
            raise InvalidArgument(f"{key} has no {H_TOPIC} header (original topic unknown): use --to {own}")
        headers.pop(H_DUE, None)
        return topic.decode(), int(headers.get(H_PARTITION, b"0") or 0), headers

    def _producer(self, topic: str) -> Any:
        producer = self._producers.get(topic)
        if producer is None:
            producer = self._producers[topic] = self.client.producer(topic)
        return producer

    def _throttle(self, started: float) -> None:
        if self.opts.rate <= 0:
            return
        ahead = self.progress.redriven / self.opts.rate - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(ahead)  # the pace itself: nothing to wait for but time


def _read(client: Any, tp: TopicPartition, start: int, end: int, timeout: float = 60.0) -> Iterator[Record]:
    """The records of ``tp`` in [start, end)."""
    if start >= end:
        return
    with client.fetcher({tp: start}, max_wait_ms=100) as f:
        deadline = time.monotonic() + timeout
        while f.positions()[tp] < end:
            got = f.fetch(0.5)
            if got:
                deadline = time.monotonic() + timeout
            elif time.monotonic() > deadline:
                raise RequestTimedOut(f"reading {tp[0]}[{tp[1]}] stalled before offset {end}")
            for r in got:
                if r.offset < end:
                    yield r
