"""``sluice up``'s combined mode (the default, ``--processes combined``): every Python service in this one
process, each in a thread of its own with its own event loop, gRPC server and ports.

Why: a Python service process costs about 45 MB before it holds anything (the interpreter, grpcio,
protobuf), five of them most of ``sluice up``'s memory; in one process they share it (docs/latency.md,
"Memory"). Why a loop per thread and not one loop for all: a service's callbacks then never queue behind
another's; the GIL still serialises Python code, but it is handed over every switch interval and released
in every wait for I/O, so an idle or waiting service costs the others nothing (docs/cli.md, "Combined mode").

A :class:`ServiceThread` stands where a child process would in :class:`~sluice.cli.supervisor.Supervisor`:
the same start, ready line, log file, stop and exit code, so start order, the banner and the stop order are
one code path for both modes. A service that ends on its own (a crash) is reported as a dead child is, and
``sluice up`` stops everything and exits 1: one process, restarted whole by whatever supervises it, is
never left with some services dead and the others serving.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import BinaryIO

from sluice.cli.errors import CliError
from sluice.cli.supervisor import SERVICE_READY, Child, Waker
from sluice.common.memory import tune_allocator
from sluice.server.embedded import Host, current_host, enter

__all__ = ["ServiceThread", "route_logging"]

log = logging.getLogger(__name__)

#: How long to wait for a service thread that did not stop within its grace period before leaving it:
#: the process exits around it (its state is on disk as after a kill -9).
ABANDON_JOIN_S = 1.0


class ServiceThread(Child):
    """One service in a thread of this process, supervised as a child process is.

    ``module`` is the one whose ``main(argv)`` runs the service (as ``sluice <service>`` does); ``argv``
    the service's own arguments (what follows ``sluice <service>``).
    """

    def __init__(
        self, name: str, module: str, argv: list[str], log_path: Path, waker: Waker, *, echo: bool = False
    ) -> None:
        super().__init__(name, argv, log_path, SERVICE_READY, waker, echo=echo)
        self.module = module
        self.host = Host(name, self._say)
        self._thread: threading.Thread | None = None
        self._log: BinaryIO | None = None
        self._log_lock = threading.Lock()
        self._code: int | None = None
        self._abandoned = False

    @property
    def pid(self) -> int:
        return os.getpid()

    @property
    def returncode(self) -> int | None:
        return self._code

    def start(self) -> None:
        if self._thread is not None:
            raise CliError("RESTART_UNSUPPORTED", "a service of the combined mode cannot be restarted alone")
        self.started_at = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        command = " ".join(self.argv)
        self._say(f"==== {stamp} sluice up starts: {self.name} (in process {os.getpid()}) {command}")
        self._thread = threading.Thread(target=self._run, name=f"svc-{self.name}", daemon=True)
        self._thread.start()

    def _say(self, line: str) -> None:
        with self._log_lock:
            if self._log is not None:
                self.output(f"{line}\n".encode(), self._log)

    def _run(self) -> None:
        enter(self.host)
        try:
            code = int(importlib.import_module(self.module).main(list(self.argv)))
        except BaseException:  # a bug, an argparse exit: the service's log and exit code say so
            self._say(f"{self.name} ended with an exception:\n{traceback.format_exc().rstrip()}")
            code = 1
        with self._log_lock:
            self._code = code
            self.exited = True
            if self._log is not None:
                self._log.close()
                self._log = None
        self._waker.notify()

    def send(self, sig: signal.Signals) -> None:
        if sig == signal.SIGKILL:
            # A thread cannot be killed: it ends with the process (its data as a kill -9 leaves it).
            self._abandoned = True
            log.warning("%s did not stop within its grace period", self.name)
        elif not self.exited:
            self.host.request_stop()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join(ABANDON_JOIN_S if self._abandoned else None)

    def restart(self) -> None:
        raise CliError("RESTART_UNSUPPORTED", "--restart needs --processes separate")


class _ServiceLogs(logging.Handler):
    """Each record to the log of the service whose thread (or task, or ``to_thread`` call) logged it;
    the rest (a library's own thread) to ``fallback``."""

    def __init__(self, fallback: logging.Handler) -> None:
        super().__init__()
        self._fallback = fallback

    def emit(self, record: logging.LogRecord) -> None:
        host = current_host()
        if host is None:
            self._fallback.handle(record)
            return
        try:
            host.say(self.format(record))
        except Exception:  # logging must not raise into the service
            self.handleError(record)


def route_logging(logs: Path) -> None:
    """Before the first service thread: one logging set-up for the process (the services' own
    ``basicConfig`` then does nothing), and the allocator tuned before the threads exist (docs/memory.md)."""
    logs.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    fallback = logging.FileHandler(logs / "up.log")
    fallback.setFormatter(fmt)
    handler = _ServiceLogs(fallback)
    handler.setFormatter(fmt)
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    with contextlib.suppress(OSError):
        tune_allocator()
