"""Applying partition updates without holding the event loop for their file work.

Creating a log is a directory, ``partition.json`` (write, fsync, rename, fsync the directory) and the first
segment's files: ~6.5 ms on this disk, so an ``UpdatePartitions`` creating 1,000 partitions held the broker's
event loop for seconds and every produce and fetch on the partitions already served waited (docs/storage.md,
"The assignment journal"). :class:`UpdateRunner` applies an update in the registry's three steps:

1. on the loop, under the flusher's ``io_lock`` (no fsync round runs while logs are closed or deleted):
   ``PartitionRegistry.begin`` (validate, the controller epoch check, plan against the epochs held, unserve
   and delete), then ``begun(plan)`` (the service stops its replica fetchers writing into deleted logs);
2. in a worker thread, ``chunk`` logs at a time, ``io_lock`` not held: ``create_logs``;
3. on the loop, under ``io_lock``: ``finish`` (serve, roles, the journal frame with the epochs, fsynced, the
   book and the version), then ``applied()`` (the service's leader states and replica fetchers), with no
   await between them, as when it was one step.

Updates apply one at a time, in arrival order (a FIFO lock), so none is planned against a half-applied one.
An update runs in its own task, shielded from its caller: a caller that goes away (an RPC past its
deadline) does not cut it between steps; it finishes and is journaled, which the coordinator allows for (a
timed-out push "may yet be applied", and heartbeats reconcile). Once ``stopping()``, the logs not yet
created count as failed: the update fails, keeps its version, and comes again after the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from sluice.broker.assignment import AssignmentUpdate, PartitionRegistry, UpdatePlan
from sluice.broker.fetch import TopicPartitionKey
from sluice.errors import BrokerNotAvailable, StorageError

__all__ = ["CREATE_CHUNK", "UpdateRunner"]

#: Logs an update creates per trip to the worker thread: each trip is a few hundred ms of fsyncs at most,
#: so a stop() is noticed soon, and the thread hand-off is paid once per 64 logs.
CREATE_CHUNK = 64


class UpdateRunner:
    """Runs a broker's partition updates. Caller: ``BrokerService.update_partitions``."""

    def __init__(
        self,
        registry: PartitionRegistry,
        io_lock: asyncio.Lock,
        stopping: Callable[[], bool],
        track: Callable[[], contextlib.AbstractContextManager[None]],
        chunk: int = CREATE_CHUNK,
    ) -> None:
        self._registry = registry
        self._io_lock = io_lock
        self._stopping = stopping
        #: The service's in-flight count: stop() lets a running update finish before closing the logs.
        self._track = track
        self._chunk = chunk
        self._order = asyncio.Lock()
        #: Updates running (strong references: a task whose caller went away must not be collected).
        self._running: set[asyncio.Task[UpdatePlan | None]] = set()

    async def apply(
        self,
        update: AssignmentUpdate,
        begun: Callable[[UpdatePlan], None],
        applied: Callable[[], None],
    ) -> UpdatePlan | None:
        """Apply ``update``; returns its plan, or None when it was stale. ``begun`` and ``applied`` run
        on the loop under ``io_lock``, right after the unserve/delete step and after the journaled finish
        (also for a stale update, as before the split); an update that fails skips ``applied``."""
        task = asyncio.create_task(self._run(update, begun, applied), name="update-partitions")
        self._running.add(task)
        task.add_done_callback(self._done)
        return await asyncio.shield(task)

    def _done(self, task: asyncio.Task[UpdatePlan | None]) -> None:
        self._running.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: when the caller went away, the coordinator resends on its own

    async def _run(
        self,
        update: AssignmentUpdate,
        begun: Callable[[UpdatePlan], None],
        applied: Callable[[], None],
    ) -> UpdatePlan | None:
        async with self._order:
            with self._track():
                return await self._steps(update, begun, applied)

    async def _steps(
        self,
        update: AssignmentUpdate,
        begun: Callable[[UpdatePlan], None],
        applied: Callable[[], None],
    ) -> UpdatePlan | None:
        registry = self._registry
        async with self._io_lock:
            if self._stopping():  # stop() may have begun while this update waited
                raise BrokerNotAvailable("the broker is shutting down")
            plan = registry.begin(update)
            if plan is None:
                applied()
                return None
            begun(plan)
        items = registry.new_logs(plan)
        failed: dict[TopicPartitionKey, StorageError] = {}
        done = 0
        try:
            while done < len(items) and not self._stopping():
                part = items[done : done + self._chunk]
                failed.update(await asyncio.to_thread(registry.create_logs, part))
                done += len(part)
        finally:
            if done < len(items):  # stopping, or a chunk failed unexpectedly: the rest is not created
                why = "the broker is shutting down" if self._stopping() else "the update was interrupted"
                failed.update((item.key, StorageError(why)) for item in items[done:])
            async with self._io_lock:
                registry.finish(plan, update, failed)  # raises when a log is missing: applied() skipped
                applied()
        return plan
