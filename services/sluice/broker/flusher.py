"""The flush policy: when appended data is fsynced, and when a produce may be acknowledged.

- ``always``: group commit. One flusher task per broker; a produce that wants acks marks its
  partitions dirty and waits. The flusher takes *every* waiter and dirty partition present
  when it starts a round, fsyncs them in a worker thread (appends go on meanwhile) and then
  releases all those waiters together. A produce that arrives during a round is served by the
  next one: each waiter is released by the first fsync that *started after its append*, and
  one fsync serves all the produces waiting for it.
- ``interval``: a periodic task fsyncs the partitions appended to since the last round.
  A produce is acknowledged after the append (the data is in the OS page cache).
- ``never``: the OS decides; the broker fsyncs only when it stops.

``io_lock`` is held while an fsync runs, so segment rolls, retention and partition removal
(which close files) never race an fsync of the same files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum
from typing import Protocol

from sluice.broker.fetch import TopicPartitionKey
from sluice.errors import InvalidArgument, SluiceError, StorageError

log = logging.getLogger(__name__)


class FlushPolicy(StrEnum):
    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"

    @classmethod
    def parse(cls, text: str) -> FlushPolicy:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise InvalidArgument(f"invalid flush policy {text!r}: use always, interval or never") from None


class Flushable(Protocol):
    def flush(self) -> None: ...


def _fsync_all(logs: list[tuple[TopicPartitionKey, Flushable]]) -> list[TopicPartitionKey]:
    """fsync each log (worker thread); returns the partitions that failed."""
    failed: list[TopicPartitionKey] = []
    for key, plog in logs:
        try:
            plog.flush()
        except SluiceError as exc:  # typed (ENOSPC, EIO): one line, no traceback per round while it lasts
            log.error("fsync of %s/%s failed: %s", *key, exc)
            failed.append(key)
        except Exception:
            log.exception("fsync of %s/%s failed", *key)
            failed.append(key)
    return failed


class Flusher:
    """Applies the flush policy for one broker. Caller: the service (produce, stop)."""

    def __init__(
        self,
        policy: FlushPolicy,
        interval_s: float,
        observe_fsync: Callable[[float, int], None] | None = None,
    ) -> None:
        self.policy = policy
        self.interval_s = interval_s
        self._observe = observe_fsync
        self._dirty: dict[TopicPartitionKey, Flushable] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sluice-fsync")
        self._task: asyncio.Task[None] | None = None
        self.io_lock = asyncio.Lock()
        #: fsync rounds done and produce requests released by them (for tests and metrics).
        self.rounds = 0
        #: Told the partitions each round fsync'ed (a replicated partition's HW may move then).
        self.after_round: Callable[[list[TopicPartitionKey]], None] | None = None

    def start(self) -> None:
        if self.policy is FlushPolicy.ALWAYS:
            self._task = asyncio.create_task(self._group_commit_loop(), name="flusher")
        elif self.policy is FlushPolicy.INTERVAL:
            self._task = asyncio.create_task(self._interval_loop(), name="flusher")

    def mark_dirty(self, key: TopicPartitionKey, plog: Flushable) -> None:
        """The partition was appended to. Caller: produce, after each successful append."""
        if self.policy is not FlushPolicy.NEVER:
            self._dirty[key] = plog

    def forget(self, key: TopicPartitionKey) -> Flushable | None:
        """The partition is being closed or deleted: drop it from the next round.

        Returns the log if it had unflushed appends; the caller fsyncs it itself (under
        ``io_lock``) so that a produce waiting on the next round is still covered.
        """
        return self._dirty.pop(key, None)

    def kick(self) -> None:
        """Start a group-commit round soon without waiting for it (acks=0 under always)."""
        if self.policy is FlushPolicy.ALWAYS:
            self._wake.set()

    async def wait_durable(self) -> None:
        """Return once everything appended before this call is fsynced (flush=always).

        Under ``interval`` and ``never`` it returns at once: acknowledgement does not wait for
        the disk. Raises StorageError when the fsync failed.
        """
        if self.policy is not FlushPolicy.ALWAYS:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._wake.set()
        await fut

    async def _group_commit_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.flush_round()

    async def _interval_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.flush_round()

    async def flush_round(self) -> None:
        """fsync every dirty partition, then release the waiters present when it began."""
        dirty, self._dirty = self._dirty, {}
        waiters, self._waiters = self._waiters, []
        if not dirty and not waiters:
            return
        try:
            failed = await self._fsync(dirty, len(waiters))
        except asyncio.CancelledError:
            # Stopping mid-round: hand everything to the final round in stop().
            self._waiters[:0] = waiters
            for key, plog in dirty.items():
                self._dirty.setdefault(key, plog)
            raise
        self.rounds += 1
        for key in failed:
            # Keep it dirty so the next round retries.
            self._dirty.setdefault(key, dirty[key])
        if self.after_round is not None and dirty:
            self.after_round([key for key in dirty if key not in failed])
        error = (
            StorageError(f"fsync failed for {', '.join(f'{t}/{p}' for t, p in failed)}") if failed else None
        )
        for fut in waiters:
            if fut.done():
                continue  # the produce gave up (timeout or cancellation)
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)

    async def _fsync(
        self, dirty: dict[TopicPartitionKey, Flushable], waiters: int
    ) -> list[TopicPartitionKey]:
        failed: list[TopicPartitionKey] = []
        async with self.io_lock:
            started = time.perf_counter()
            if dirty:
                loop = asyncio.get_running_loop()
                try:
                    failed = await loop.run_in_executor(self._executor, _fsync_all, list(dirty.items()))
                except Exception:  # the executor itself failed: nothing is known durable
                    log.exception("fsync round failed")
                    failed = list(dirty)
            if self._observe is not None:
                self._observe(time.perf_counter() - started, waiters)
        return failed

    async def stop(self) -> None:
        """Stop the periodic task, fsync what is dirty and release any waiter."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            await self.flush_round()
        self._executor.shutdown(wait=True)
