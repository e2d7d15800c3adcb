"""The asyncio group consumer: the sync :class:`~sluice.client.consumer.Consumer`, awaited.

::

    async with client.consumer("g", ["orders"], auto_offset_reset="earliest") as consumer:
        async for record in consumer:
            await handle(record)
            await consumer.commit()

Every poll runs the sync consumer's own steps (docs/asyncio.md): ``_poll_prepare`` (rebalance work
and its callbacks; in a worker thread when there is any), ``_poll_take`` (takes records from the
prefetch buffer, on the loop's thread) and a wait on an asyncio future that the consumer's
condition resolves through a waker. Records are taken only after the wait, in the same step that
returns them, with no ``await`` in between: cancelling ``poll``/``getmany``/``getone``/``async for``
loses no record.

Blocking calls (``commit``, ``committed``, ``close``, offset look-ups) run in worker threads, one at a
time per consumer, as the sync consumer's one application thread would. Callbacks (``on_assign``,
``on_revoke``, ``on_lost``, ``on_commit``, a ``listener``'s methods, a commit ``callback``) may be
``async def``: they run on the loop, awaited by the thread that calls them.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

from sluice.aio.bridge import LoopBridge, Serial, resolve
from sluice.client.consumer import Consumer as SyncConsumer
from sluice.client.consumer import ConsumerConfig, ConsumerStats
from sluice.client.consumer.config import CommitCallback
from sluice.client.consumer.parker import ParkOutcome
from sluice.client.consumer.retry import RetryOutcome
from sluice.client.offsets import OffsetSpec
from sluice.codec.batch import Record, RecordColumns
from sluice.errors import InvalidArgument, SluiceError

__all__ = ["Consumer", "bridge_callbacks"]

TopicPartition = tuple[str, int]
_CALLBACKS = ("on_assign", "on_revoke", "on_lost", "on_commit")
_T = TypeVar("_T")


class Consumer:
    """A member of a consumer group, for asyncio. Made by ``sluice.aio.Client.consumer``."""

    def __init__(self, sync: SyncConsumer, bridge: LoopBridge, list_offsets: Callable[..., Any]) -> None:
        self._sync = sync
        self._bridge = bridge
        self._serial = Serial()
        self._list_offsets = list_offsets
        #: park_poison_keys: what a cancelled poll's worker thread returned, for the next poll.
        self._carried: list[Record] = []

    @property
    def sync(self) -> SyncConsumer:
        """The thread-based consumer underneath (the same object, for code shared with sync callers)."""
        return self._sync

    @property
    def group(self) -> str:
        return self._sync.group

    @property
    def config(self) -> ConsumerConfig:
        return self._sync.config

    @property
    def member_id(self) -> str:
        return self._sync.member_id

    @property
    def member_epoch(self) -> int:
        return self._sync.member_epoch

    @property
    def closed(self) -> bool:
        return self._sync.closed

    # ---- receiving ------------------------------------------------------------------------------

    async def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[Record]:  # noqa: ASYNC109
        """Records from the assigned partitions, waiting up to ``timeout`` seconds for some (0: what
        is buffered now). As the sync ``poll()``: rebalances, callbacks, auto-commit, typed errors."""
        sync = self._sync
        sync._check_open()
        if sync._park is not None:
            return await self._poll_parked(timeout, max_records)
        sync._prefetch.columnar = False
        return await self._poll(sync._poll_take, timeout, max_records)

    async def poll_columns(
        self,
        timeout: float = 1.0,  # noqa: ASYNC109
        max_records: int | None = None,
    ) -> dict[TopicPartition, RecordColumns]:
        """The sync ``poll_columns()``: ``poll()``'s records as columns, per partition (docs/consumer.md,
        "Records as columns"); the same refusals."""
        sync = self._sync
        sync._check_open()
        sync._check_columnar()
        sync._prefetch.columnar = True
        return await self._poll(sync._poll_take_columns, timeout, max_records)

    async def _poll(
        self,
        take: Callable[[int, float], tuple[_T, float | None]],
        timeout: float,  # noqa: ASYNC109
        max_records: int | None,
    ) -> _T:
        sync = self._sync
        limit = sync.config.max_poll_records if max_records is None else _positive(max_records)
        deadline = time.monotonic() + max(float(timeout), 0.0)
        serial = self._serial
        await serial.acquire()
        try:
            if sync._poll_may_block():
                await serial.in_thread(sync._poll_started)
            else:
                sync._poll_started()
        finally:
            serial.release()
        while True:
            await serial.acquire()
            try:
                if sync._poll_may_block():
                    await serial.in_thread(sync._poll_prepare)
                else:
                    sync._poll_light()
                # From here to the return: no await. The records leave the buffer only to be returned.
                with sync._lock:
                    records, wait = take(limit, deadline)
                    if records or wait is None:
                        return records
                    if wait > 0:
                        waiter: asyncio.Future[None] = self._bridge.loop.create_future()
                        wake = functools.partial(self._bridge.post, functools.partial(resolve, waiter))
                        sync._ready.add_waker(wake)
            finally:
                serial.release()
            if wait > 0:
                try:
                    await asyncio.wait({waiter}, timeout=wait)
                finally:
                    with sync._lock:
                        sync._ready.remove_waker(wake)

    async def _poll_parked(self, timeout: float, max_records: int | None) -> list[Record]:  # noqa: ASYNC109
        """``park_poison_keys``: the sync ``poll()`` itself, in a worker thread. Its parking pass waits
        for the parking store's acknowledgements and replays it on assignment changes (blocking steps
        interleaved with taking records), so it is not split into loop-thread steps like the plain poll.
        A cancelled call's records, already handed out, are kept and returned by the next poll: none is
        lost (docs/poison-keys.md, "Pull consumers")."""
        serial = self._serial
        await serial.acquire()
        try:
            carried, self._carried = self._carried, []
            if carried:
                return carried
            return await serial.in_thread(self._sync.poll, timeout, max_records, orphan=self._carry)
        finally:
            serial.release()

    def _carry(self, records: list[Record]) -> None:
        self._carried = records

    async def getmany(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[Record]]:
        """aiokafka's ``getmany``: records by partition, waiting up to ``timeout_ms`` for some (0: what
        is buffered now, maybe nothing)."""
        out: dict[TopicPartition, list[Record]] = {}
        for r in await self.poll(timeout_ms / 1000.0, max_records):
            out.setdefault((r.topic, r.partition), []).append(r)
        return out

    async def getone(self) -> Record:
        """The next record, waiting as long as it takes (aiokafka's ``getone``). Raises SluiceError
        when the consumer is closed meanwhile."""
        while True:
            records = await self.poll(_WAIT, max_records=1)
            if records:
                return records[0]
            self._sync._check_open()

    def __aiter__(self) -> AsyncIterator[Record]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Record]:
        """``async for record in consumer``: one record per step (see the sync ``__iter__``: a
        ``commit()`` in the loop covers the records reached, never later ones), until closed."""
        sync = self._sync
        while not sync.closed:
            try:
                records = await self.poll(_WAIT, max_records=1)
            except SluiceError:
                if sync.closed:
                    return
                raise
            for r in records:
                yield r

    def done(self, record: Record) -> None:
        """``commit_mode="in-flight-min"``: ``record`` is processed."""
        self._sync.done(record)

    # ---- commits ----------------------------------------------------------------------------------

    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> dict[TopicPartition, int]:
        """Commit and wait (the sync ``commit()``, in a worker thread)."""
        return await self._serial.run(self._sync.commit, offsets)

    async def commit_async(
        self, offsets: Mapping[TopicPartition, int] | None = None, callback: CommitCallback | None = None
    ) -> None:
        """Queue a commit and return at once (the sync ``commit_async()``); ``callback`` may be
        ``async def``. Its outcome reaches the callback (else ``on_commit``) in a later call."""
        cb = None if callback is None else _bridged(callback, self._bridge.loop)
        await self._run(self._sync.commit_async, offsets, cb)

    async def reconsume_later(
        self, record: Record, delay_level: int | None = None, delay: timedelta | None = None
    ) -> RetryOutcome:
        """The sync ``reconsume_later()`` (docs/retry.md), in a worker thread."""
        return await self._serial.run(self._sync.reconsume_later, record, delay_level, delay)

    async def fail(self, record: Record) -> ParkOutcome:
        """The sync ``fail()`` (``park_poison_keys=True``, docs/poison-keys.md), in a worker thread: it
        returns once the parking store acknowledged the writes."""
        return await self._serial.run(self._sync.fail, record)

    def is_parked(self, record: Record) -> bool:
        """The sync ``is_parked()``: ``record`` was parked behind an earlier failure of its key."""
        return self._sync.is_parked(record)

    def stats(self) -> ConsumerStats:
        return self._sync.stats()

    async def subscribe(self, topics: Mapping[str, str] | Iterable[str] | str) -> None:
        """The sync ``subscribe()`` in a worker thread: it waits for the coordinator's answer."""
        await self._serial.run(self._sync.subscribe, topics)

    # ---- positions --------------------------------------------------------------------------------

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._sync.seek(tp, offset)

    def position(self, tp: TopicPartition) -> int | None:
        return self._sync.position(tp)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self._sync.highwater(tp)

    async def committed(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, int | None]:
        return await self._serial.run(self._sync.committed, partitions)

    def assignment(self) -> frozenset[TopicPartition]:
        return self._sync.assignment()

    def tracks(self) -> dict[TopicPartition, str]:
        return self._sync.tracks()

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        self._sync.pause(partitions)

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self._sync.resume(partitions)

    def paused(self) -> frozenset[TopicPartition]:
        return self._sync.paused()

    async def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's log start offset."""
        return await self._offsets(partitions, "earliest")

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's high watermark (the offset the next record gets)."""
        return await self._offsets(partitions, "latest")

    async def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """For each partition, the first offset whose record timestamp (ms) is >= the one given (the
        high watermark when none is)."""
        out: dict[TopicPartition, int] = {}
        for ts in sorted(set(timestamps.values())):
            found = await self._offsets([tp for tp, t in timestamps.items() if t == ts], ts)
            out.update(found)
        return out

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Seek ``partitions`` (default: every assigned one) to their log start."""
        for tp, off in (await self.beginning_offsets(partitions or self.assignment())).items():
            self.seek(tp, off)

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Seek ``partitions`` (default: every assigned one) to their high watermark."""
        for tp, off in (await self.end_offsets(partitions or self.assignment())).items():
            self.seek(tp, off)

    async def _offsets(
        self, partitions: Iterable[TopicPartition], spec: OffsetSpec
    ) -> dict[TopicPartition, int]:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions:
            by_topic.setdefault(topic, []).append(partition)
        out: dict[TopicPartition, int] = {}
        loop = self._bridge.loop
        for topic, parts in by_topic.items():
            found = await loop.run_in_executor(
                None, functools.partial(self._list_offsets, topic, spec, parts)
            )
            out.update({(topic, p): off for p, off in found.items()})
        return out

    # ---- lifecycle --------------------------------------------------------------------------------

    async def close(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """The sync ``close()`` (final commit, ``on_revoke``, leave the group), in a worker thread."""
        if self._sync.closed:
            return
        # Not through the Serial: close also ends a poll waiting in another task (it wakes up, closed).
        loop = self._bridge.loop
        await loop.run_in_executor(None, self._sync.close, timeout)

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<aio {self._sync!r}>"

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A non-blocking call that may run callbacks: in a worker thread when one is async."""
        if self._sync._poll_may_block():
            return await self._serial.run(fn, *args)
        return await self._serial.inline(fn, *args)


#: How long one wait of getone()/``async for`` lasts before it checks whether the consumer closed.
_WAIT = 1.0


def _positive(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"max_records must be an integer >= 1, got {value!r}")
    return value


def bridge_callbacks(config: ConsumerConfig, loop: asyncio.AbstractEventLoop) -> ConsumerConfig:
    """``config`` with its ``async def`` callbacks (fields and listener methods) made callable from the
    SDK's threads: each call runs the coroutine on ``loop`` and waits for it."""
    changes: dict[str, Any] = {}
    for name in _CALLBACKS:
        fn = getattr(config, name)
        if fn is None and config.listener is not None and name != "on_commit":
            fn = getattr(config.listener, name, None)
        if fn is not None and asyncio.iscoroutinefunction(fn):
            changes[name] = _bridged(fn, loop)
    return config.replace(**changes) if changes else config


def _bridged(fn: Callable[..., Any], loop: asyncio.AbstractEventLoop) -> Callable[..., None]:
    if not asyncio.iscoroutinefunction(fn):
        return fn

    def call(*args: Any) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            # Called on the loop's own thread (a non-blocking call found an outcome): it cannot wait
            # for the coroutine there, so it runs as a task.
            loop.create_task(fn(*args))
            return
        asyncio.run_coroutine_threadsafe(fn(*args), loop).result()

    return call
