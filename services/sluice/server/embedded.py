"""A service running inside another process (``sluice up``'s combined mode, docs/cli.md): how it is told
to stop and how it says it is ready, instead of signals and stdout.

A service process owns its signals and its stdout: ``serve`` stops on SIGTERM/SIGINT and prints its ready
line for the launcher to read. Several services sharing one process cannot: only the main thread may
handle signals, and one stdout cannot tell their lines apart. The launcher therefore runs each service in
its own thread with a :class:`Host` in a context variable (asyncio copies it into every task and
``to_thread`` call of that service); ``serve`` and the scheduler ask :func:`current_host` and, under one,
register their stop with it and hand it their ready line. Without a host (a service process) nothing
changes.
"""

from __future__ import annotations

import contextvars
import os
import signal
import threading
from collections.abc import Callable

__all__ = ["Host", "current_host", "enter", "request_stop", "say"]


class Host:
    """What a service thread is given by the process that runs it. Thread-safe: the launcher's main
    thread calls :meth:`request_stop`, the service's thread :meth:`on_stop`."""

    def __init__(self, name: str, say: Callable[[str], None]) -> None:
        self.name = name
        #: Where the service's lines go (its ready line, its stopped line): its log, and the launcher's watch.
        self.say = say
        self._lock = threading.Lock()
        self._stop: Callable[[], object] | None = None
        self.stop_requested = False

    def on_stop(self, stop: Callable[[], object]) -> None:
        """``stop`` (thread-safe) runs on the launcher's stop request; at once if one already came."""
        with self._lock:
            self._stop = stop
            requested = self.stop_requested
        if requested:
            stop()

    def request_stop(self) -> None:
        with self._lock:
            self.stop_requested = True
            stop = self._stop
        if stop is not None:
            stop()


_HOST: contextvars.ContextVar[Host | None] = contextvars.ContextVar("sluice_embedded_host", default=None)


def current_host() -> Host | None:
    """The host of the calling service, or None in a process of its own."""
    return _HOST.get()


def enter(host: Host) -> None:
    """Make ``host`` the calling thread's (the first thing a service thread does)."""
    _HOST.set(host)


def request_stop() -> None:
    """Stop the calling service as SIGTERM would stop its process (a refused start-up's way out)."""
    host = current_host()
    if host is None:
        os.kill(os.getpid(), signal.SIGTERM)
    else:
        host.request_stop()


def say(line: str) -> None:
    """A line for the launcher (the ready line): stdout in a process of its own, else the host's."""
    host = current_host()
    if host is None:
        print(line, flush=True)
    else:
        host.say(line)
