"""How asyncio code drives the thread-based SDK: completions into futures, blocking calls into threads.

- :class:`LoopBridge` hands completions from the SDK's threads (the producer's sender, gRPC callbacks)
  to one event loop: callables queue up and one ``call_soon_threadsafe`` drains them, so a burst of
  acknowledgements costs one wake-up of the loop, not one each.
- :class:`Serial` runs the calls of one SDK object one at a time, as its one application thread
  would (the group consumer's contract), the blocking ones in a worker thread. A call whose awaiting
  task is cancelled runs to its end in its thread; the next call waits for it first.
- :class:`Starting` is what ``client.producer(...)`` and the consumers return: await it for the part,
  or ``async with`` it to close the part at the end.

See docs/asyncio.md.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["LoopBridge", "Serial", "Starting", "resolve"]

T = TypeVar("T")


class LoopBridge:
    """Runs callables on ``loop``'s thread, posted from any thread, one loop wake-up per burst."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: deque[Callable[[], None]] = deque()
        self._scheduled = False

    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` soon on the loop's thread (dropped if the loop is closed)."""
        with self._lock:
            self._pending.append(fn)
            if self._scheduled:
                return  # the drain already scheduled takes it
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody awaits these any more
            with self._lock:
                self._pending.clear()
                self._scheduled = False

    def _drain(self) -> None:
        with self._lock:
            todo, self._pending = self._pending, deque()
            self._scheduled = False
        for fn in todo:
            fn()


def resolve(fut: asyncio.Future[None]) -> None:
    """Mark a wake-up future done (on the loop's thread); a cancelled or done one is left alone."""
    if not fut.done():
        fut.set_result(None)


class Serial:
    """One call at a time on one SDK object; ``run`` sends a blocking call to a worker thread."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        #: The worker-thread call of a cancelled task, still running: the next call waits for it.
        self._running: asyncio.Future[Any] | None = None

    async def acquire(self) -> None:
        await self._lock.acquire()
        try:
            running = self._running
            if running is not None and not running.done():
                await asyncio.wait({running})
            self._running = None
        except BaseException:
            self._lock.release()
            raise

    def release(self) -> None:
        self._lock.release()

    async def in_thread(
        self, fn: Callable[..., T], *args: Any, orphan: Callable[[T], None] | None = None, **kwargs: Any
    ) -> T:
        """Run ``fn`` in a worker thread (the caller holds this Serial). If the caller is cancelled,
        ``fn`` still runs to its end and ``orphan`` gets its result, before the next call of this Serial
        starts (so a call whose result must not be lost, a poll, can hand it to the next one)."""
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(None, functools.partial(fn, *args, **kwargs))
        self._running = fut
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            fut.add_done_callback(_consume_exception if orphan is None else functools.partial(_adopt, orphan))
            raise

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Acquire, run ``fn`` in a worker thread, release."""
        await self.acquire()
        try:
            return await self.in_thread(fn, *args, **kwargs)
        finally:
            self.release()

    async def inline(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Acquire, run the non-blocking ``fn`` on the loop's thread, release."""
        await self.acquire()
        try:
            return fn(*args, **kwargs)
        finally:
            self.release()


def _consume_exception(fut: asyncio.Future[Any]) -> None:
    # Nobody awaits a cancelled caller's call any more: retrieve its exception so asyncio does not log it.
    if not fut.cancelled():
        fut.exception()


def _adopt(orphan: Callable[[T], None], fut: asyncio.Future[T]) -> None:
    # Added before acquire()'s wait on the same future, so it runs first: the next call sees the result.
    if not fut.cancelled() and fut.exception() is None:
        orphan(fut.result())


class _Closable(Protocol):
    async def close(self) -> None: ...


P = TypeVar("P", bound=_Closable)


class Starting(Generic[P]):
    """``await client.producer(...)`` gives the producer; ``async with client.producer(...) as p``
    also closes it when the block ends."""

    __slots__ = ("_coro", "_part")

    def __init__(self, coro: Coroutine[Any, Any, P]) -> None:
        self._coro = coro
        self._part: P | None = None

    def __await__(self) -> Generator[Any, None, P]:
        return self._coro.__await__()

    async def __aenter__(self) -> P:
        self._part = await self._coro
        return self._part

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._part is not None:
            await self._part.close()
