"""The parking store of a push subscription: ``<topic>.<subscription>.PARK`` (docs/poison-keys.md).

One partition, written as the event log the pull side writes (``retry.parkbook``: ``park``, ``fail``,
``resolved``, ``unpark``, each with its source coordinates) and replayed with the same ``ParkBook``.
``parking.py`` decides what to write (``Effects.park_events``); this module appends the events in
order, one produce in flight per subscription (``acks=-1``), and only once the broker acknowledged a
``park`` does the subscription acknowledge that message on its cursor (``Subscription.parks_saved``).
A failed write is retried, in order, with a backoff (nothing is acknowledged meanwhile, so nothing is
lost: the message stays unacknowledged on the cursor and is read again after a crash). A ``kill -9``
anywhere costs at most a repeated write, which the replay drops by source (``ParkBook.add``) and
``parkrestore.restore`` acknowledges on the cursor.

The topic is created on the first write (like the DLQ's) and read at load (``parkread.replay``) before
the subscription's feeds read anything: from its last snapshot (``retry.parksnap``), which this store
writes every ``SNAPSHOT_EVERY`` events from the replayed state it keeps up to date (``book``: the load's
replay, then every event the broker acknowledged), so a restart reads a bounded tail of the log.

**Dead letters once** (``guard_dead_letters``). Before a parked key's messages go to the DLQ, a
``dlqmark`` event records an offset of the DLQ below which none of them can land, and is acknowledged;
each dead letter carries its source (``sluice-retry-source``). A restart reads the DLQ from the mark and
drops the parked messages found there (``ParkBook.drop_dead``): a crash between the DLQ's
acknowledgement and the ``resolved`` event does not dead-letter them twice.

A non-durable subscription has no store (it does not outlive its consumers, nor its dispatcher): its
parks count as saved at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Mapping

from sluice.codec.batch import Record
from sluice.common.list_offsets import LATEST
from sluice.common.peers import AioPeers
from sluice.common.timeouts import within
from sluice.dispatcher.cluster import CoordinatorLink
from sluice.dispatcher.model import ParkEvent
from sluice.dispatcher.parkread import Replayed, live_state, produce, replay, write_snapshot
from sluice.dispatcher.parkrestore import Restorable, restore
from sluice.errors import SluiceError
from sluice.retry.levels import source_key
from sluice.retry.parkbook import (
    H_DLQ_MARK,
    H_HOW,
    H_OP,
    H_PCOUNT,
    H_PDUE,
    H_PSOURCE,
    ParkBook,
    sub_park_topic,
)
from sluice.retry.parksnap import snapshot_records

log = logging.getLogger(__name__)

__all__ = ["CRASH_ENV", "SNAPSHOT_ENV", "ParkStore", "event_record", "replay"]

#: Events per produce (a parked message is one event of its own size).
MAX_EVENTS = 1000
MAX_BYTES = 4 * 1024 * 1024
#: A snapshot after this many acknowledged events since the last one: a restart reads at most about
#: this many events of the log after the snapshot (``parkread.replay``).
SNAPSHOT_EVERY = 20_000
#: The DLQ mark moves up when it is this far behind the DLQ's end (and nothing below is unresolved):
#: a restart reads the DLQ from the mark.
MARK_LAG = 10_000
#: Fault injection for the crash tests: ``kill -9`` this process once this many parked messages were
#: dead-lettered (the DLQ acknowledged them) and before their ``resolved`` event is written.
CRASH_ENV = "SLUICE_PARK_CRASH_AFTER_DLQ"
#: Tests: ``SNAPSHOT_EVERY`` for this process (a test's store is too small to reach 5,000 events).
SNAPSHOT_ENV = "SLUICE_PARK_SNAPSHOT_EVERY"


def event_record(topic: str, e: ParkEvent, wall_ms: int) -> Record:
    """``e`` as the record the store holds (``retry.parkbook``'s event format). A parked message keeps
    its key, value, tag and headers; its timestamp becomes the time it was parked (the key's age)."""
    return _event_records(topic, e, wall_ms)[0]


def _event_records(topic: str, e: ParkEvent, wall_ms: int) -> tuple[Record, Record | None]:
    """``e``'s record for the store and, for a ``park``, the parked record as the replay makes it (so
    the kept state takes it without parsing the event back, as the pull side's ``Parker`` does)."""
    src = source_key(topic, e.partition, e.offset).encode()
    if e.op == "park":
        assert e.message is not None
        r = e.message.record
        parked = Record(topic, e.partition, e.offset, e.key, r.value, r.tag, r.headers, wall_ms)
        headers = {**r.headers, H_OP: b"park", H_PSOURCE: src}
        if e.count:
            headers[H_PCOUNT] = str(e.count).encode()
            headers[H_PDUE] = b"0"
        return Record("", 0, -1, e.key, r.value, r.tag, headers, wall_ms), parked
    if e.op == "fail":
        headers = {H_OP: b"fail", H_PSOURCE: src, H_PCOUNT: str(e.count).encode(), H_PDUE: b"0"}
    elif e.op == "resolved":
        headers = {H_OP: b"resolved", H_PSOURCE: src, H_HOW: e.how.encode()}
    elif e.op == "dlqmark":
        headers = {H_OP: b"dlqmark", H_DLQ_MARK: str(e.offset).encode()}
    else:  # unpark: every partition of the key
        headers = {H_OP: b"unpark"}
    return Record("", 0, -1, e.key, b"", None, headers, wall_ms), None


class ParkStore:
    """The store of one loaded subscription. Caller: ``SubscriptionRuntime``."""

    def __init__(
        self,
        topic: str,
        subscription: str,
        link: CoordinatorLink,
        channels: AioPeers,
        saved: Callable[[dict[int, list[int]]], None],
        durable: bool = True,
    ) -> None:
        self.topic = topic
        self.name = sub_park_topic(topic, subscription)
        self._link = link
        self._channels = channels
        #: Called with {partition: offsets} of the ``park`` events the broker acknowledged.
        self._saved = saved
        self._queue: list[ParkEvent] = []
        self._task: asyncio.Task[None] | None = None
        self._ensured = False
        self.durable = durable
        self.closed = False
        #: The store's replayed state, kept up to date with every acknowledged event (for snapshots);
        #: None until the load's replay (``replay``).
        self.book: ParkBook | None = None
        #: Whether a snapshot of ``book`` would be the whole log's state: set by the runtime (this
        #: dispatcher served every partition of the topic since the load, so no other writer's events
        #: are missing from ``book``). With cursors, to leave out sources the cursor no longer needs.
        self.snapshot_cursors: Callable[[], Mapping[int, object] | None] = lambda: None
        self._since_snapshot = 0
        self._snapshot_every = int(os.environ.get(SNAPSHOT_ENV, "0") or 0) or SNAPSHOT_EVERY
        self._snapshot_task: asyncio.Task[None] | None = None
        #: Per partition: the cursor's (mark-delete, version) at the last snapshot, and the low bound of
        #: sources the next may use (a mark-delete known to be in the offset store).
        self._cursor_seen: dict[int, tuple[int, int]] = {}
        self._lows: dict[int, int] = {}
        #: Events queued and acknowledged so far (``durable_write`` waits on them).
        self._queued = 0
        self._acked = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        #: The DLQ's end as the last dead-lettering left it (-1: not known yet).
        self.dlq_end = -1
        self._crash_after = int(os.environ.get(CRASH_ENV, "0") or 0)
        self._dead_stored = 0

    # ---- writing ----------------------------------------------------------------------------------

    def write(self, events: list[ParkEvent]) -> None:
        """Append ``events`` after everything queued (in order, in the background)."""
        if not self.durable:
            saved = _parked(events)
            if saved:
                asyncio.get_running_loop().call_soon(self._saved, saved)
            return
        self._queue += events
        self._queued += len(events)
        if not self.closed and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._run(), name=f"park-{self.name}")

    async def _run(self) -> None:
        delay = 0.2
        while self._queue and not self.closed:
            batch = _chunk(self._queue)
            try:
                records, end = await self._append(batch)
            except (SluiceError, OSError) as exc:
                log.warning("parking %d events in %s failed: %s", len(batch), self.name, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.2
            del self._queue[: len(batch)]
            self._acked += len(batch)
            self._wake()
            if self.book is not None:
                book = self.book
                for r, parked in records:
                    if parked is None:
                        book.apply(r)
                    else:
                        book.add(parked, r)
                self._since_snapshot += len(batch)
                if self._since_snapshot >= self._snapshot_every:
                    self._snapshot(end)
            saved = _parked(batch)
            if saved:
                self._saved(saved)

    async def _append(self, events: list[ParkEvent]) -> tuple[list[tuple[Record, Record | None]], int]:
        if not self._ensured:
            await self._link.ensure_topic(self.name)
            self._ensured = True
        now = int(time.time() * 1000)
        records = [_event_records(self.topic, e, now) for e in events]
        return records, await produce(self._link, self._channels, self.name, [r for r, _ in records])

    def _wake(self) -> None:
        if self._waiters:
            done = [f for n, f in self._waiters if n <= self._acked]
            self._waiters = [(n, f) for n, f in self._waiters if n > self._acked]
            for f in done:
                if not f.done():
                    f.set_result(None)

    async def durable_write(self, events: list[ParkEvent]) -> None:
        """Append ``events`` after everything queued and return once the broker acknowledged them."""
        self.write(events)
        if not self.durable or self._acked >= self._queued:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((self._queued, fut))
        await fut

    # ---- snapshots ------------------------------------------------------------------------------

    def _snapshot(self, covers: int) -> None:
        """Start writing a snapshot of ``book`` (the log's state up to ``covers``), unless one is being
        written or the book may miss another writer's events."""
        cursors = self.snapshot_cursors()
        if cursors is None or self.book is None:
            return
        if self._snapshot_task is not None and not self._snapshot_task.done():
            return
        self._since_snapshot = 0
        lows = {(self.topic, p): self._low(p, c) for p, c in cursors.items()}
        self.book.trim_sources(lows)  # what no restart needs any more: snapshots stay small
        records = snapshot_records(self.book, covers, lows, int(time.time() * 1000))
        self._snapshot_task = asyncio.create_task(
            self._write_snapshot(records, covers), name=f"snap-{self.name}"
        )

    def _low(self, partition: int, cursor: object) -> int:
        """The lowest parked offset of ``partition`` a restart may need: the mark-delete of a cursor
        version that the offset store holds (the one seen at the previous snapshot, once saved)."""
        md, version = getattr(cursor, "mark_delete", 0), getattr(cursor, "version", 0)
        seen = self._cursor_seen.get(partition)
        if seen is not None and getattr(cursor, "saved_version", 0) >= seen[1]:
            self._lows[partition] = max(self._lows.get(partition, 0), seen[0])
        self._cursor_seen[partition] = (md, version)
        return self._lows.get(partition, 0)

    async def _write_snapshot(self, records: list[Record], covers: int) -> None:
        try:
            await write_snapshot(self._link, self._channels, self.name, records)
        except (SluiceError, OSError) as exc:
            # The next one is tried after another SNAPSHOT_EVERY events; a restart meanwhile uses the
            # previous snapshot (still valid: it covers an earlier prefix of the log) or the log.
            log.warning("snapshot of %s at %d failed: %s", self.name, covers, exc)
            return
        log.info("%s: snapshot at %d written (%d records)", self.name, covers, len(records))

    # ---- dead letters ---------------------------------------------------------------------------

    async def guard_dead_letters(self, dlq: str, advance: bool) -> None:
        """Before parked messages go to ``dlq``: make sure a ``dlqmark`` at or below where they will
        land is in the store (acknowledged). ``advance``: no earlier dead-lettered parked message is
        unresolved, so the mark may move up to the DLQ's end (it does when it lags by ``MARK_LAG``)."""
        if not self.durable or self.book is None:
            return
        mark = self.book.dlq_mark
        if mark is not None and not (advance and self.dlq_end - mark > MARK_LAG):
            return
        end = self.dlq_end
        if end < 0:
            await self._link.ensure_topic(dlq)  # as the dead letters' write would
            end = (await self._link.list_offsets(dlq, [0], LATEST))[0]
        if mark is not None and end <= mark:
            return
        await self.durable_write([ParkEvent("dlqmark", -1, end, b"")])

    def dead_letters_written(self, end: int, stored: int) -> None:
        """The DLQ acknowledged a batch (``stored`` of its messages parked ones) and ends at ``end``."""
        self.dlq_end = max(self.dlq_end, end)
        if stored and self._crash_after:
            self._dead_stored += stored
            if self._dead_stored >= self._crash_after:
                os.kill(os.getpid(), signal.SIGKILL)

    async def close(self, drain_s: float) -> None:
        """Write what is queued (bounded by ``drain_s`` seconds), then stop: an unload loses no event it can
        still write (what it cannot is written again, or re-read from the log, after the restart)."""
        task = self._task
        if task is not None and not task.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await within(asyncio.shield(task), drain_s)
        self.closed = True
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ---- replay -----------------------------------------------------------------------------------

    async def load(self, sub: Restorable, dlq: str, limit: int, now_ms: int) -> None:
        """Loading (before the feeds read): the parked keys from the store (``parkrestore.restore``).
        Snapshots are written from then on while this dispatcher serves every partition of the topic
        (with fewer, another dispatcher's events are missing from ``book``)."""
        started = time.monotonic()
        log.info("%s: loading the parking store", self.name)  # tests wait for it
        out = await self.replay(dlq)
        n = restore(sub, out.book, self.topic, limit, now_ms, int(time.time() * 1000))
        log.info(
            "%s/%s: %d parked keys restored from %s (snapshot at %d, then %d events%s) in %.3f s",
            self.topic,
            self.name,
            n,
            self.name,
            out.snapshot_covers,
            out.events,
            f"; snapshot not used: {out.fallback}" if out.fallback else "",
            time.monotonic() - started,
        )
        t = self._link.view.topics.get(self.topic)
        loaded = frozenset(sub.partitions)
        if t is None or len(t.partitions) != len(loaded):
            return

        def cursors() -> Mapping[int, object] | None:
            t = self._link.view.topics.get(self.topic)
            if sub.parking.dropped or frozenset(sub.partitions) != loaded or t is None:
                return None
            if len(t.partitions) != len(loaded):
                return None
            return {p: ps.cursor for p, ps in sub.partitions.items()}

        self.snapshot_cursors = cursors
        if (out.fallback or out.events >= self._snapshot_every // 2) and (out.book.keys or out.book.sources):
            # A snapshot now: the next load reads from here, not the whole tail again (nor a bad
            # snapshot's log again, which would otherwise stay the last one until enough new events).
            self._snapshot(out.end)

    async def replay(self, dlq: str) -> Replayed:
        """The store's state for a load: its last snapshot and the log after it (``parkread.replay``),
        less the parked messages already in ``dlq`` (found from the store's DLQ mark: a crash came
        between their dead-lettering and its ``resolved`` event), whose ``resolved`` is written now.
        The state is kept (``book``) and follows every event written from now on."""
        out = await live_state(self._link, self._channels, self.name, dlq, self.topic)
        if out.dead:
            log.info("%s: %d keys' parked messages found in %s already", self.name, len(out.dead), dlq)
            self.write(
                [ParkEvent("resolved", tp[1], through, key, how="dlq") for tp, key, through in out.dead]
            )
        self.book = out.book
        return out


def _parked(events: list[ParkEvent]) -> dict[int, list[int]]:
    """{partition: offsets} of the ``park`` events."""
    saved: dict[int, list[int]] = defaultdict(list)
    for e in events:
        if e.op == "park":
            saved[e.partition].append(e.offset)
    return dict(saved)


def _chunk(queue: list[ParkEvent]) -> list[ParkEvent]:
    """The first events of ``queue`` for one produce (at least one)."""
    size = 0
    for i, e in enumerate(queue[:MAX_EVENTS]):
        size += e.message.size if e.message is not None else 64
        if size > MAX_BYTES and i:
            return queue[:i]
    return queue[:MAX_EVENTS]
