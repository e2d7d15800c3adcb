"""Child processes for ``sluice up``: start, wait until ready, watch, stop in order.

The main thread never sleeps in a loop: every change it waits for (a child
printed its ready line, a child exited, SIGINT/SIGTERM arrived) writes a byte to
one self-pipe (:class:`Waker`), and the main thread blocks in ``select`` on it.
Signal handlers only record the signal number; the interpreter writes the wakeup
byte itself (``signal.set_wakeup_fd``), so no lock is ever taken in a handler.

With a :class:`RestartPolicy` (``sluice up --restart``) a child that exits on its own is started again after a
delay that doubles with each quick failure, as Kubernetes restarts a crashing container (CrashLoopBackOff),
so failover can be watched on a laptop: ``kill -9`` a broker and see it come back.

Each child runs in its own process group, so a Ctrl-C in the terminal reaches
``sluice up`` alone and the children are stopped in reverse start order instead
of all at once. (A ``kill -9`` of ``sluice up`` itself therefore leaves them
running, as with any supervisor; except a child started ``die_with_parent``, the combined mode's Redis.)
The combined mode's services are threads supervised through the same interface (``up_combined.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import BinaryIO

from sluice.cli.errors import CliError
from sluice.common.memory import ARENA_MAX

# What runtime.serve() prints once a service listens (see sluice.server.runtime).
SERVICE_READY = re.compile(
    r"SLUICE_READY service=(?P<service>\S+) address=(?P<address>\S+) metrics=(?P<metrics>\S+)"
    r"(?: wire=(?P<wire>\S+))?"
)
TAIL_LINES = 40
# A stop signal counts as "hurry up" only this long after the first: tools such as
# timeout(1) send one signal to the process and the same one to its group at once.
HURRY_AFTER = 1.0


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """When to start a child that exited on its own again.

    The first restart waits ``first_delay``; each quick failure after it doubles the wait up to ``max_delay``;
    a child that ran ``stable_after`` seconds before it exited starts over at ``first_delay``. Shorter than
    Kubernetes' (10 s doubling to 5 min) because a laptop session wants to see the restart, and a crash loop
    still costs one start per ``max_delay``.
    """

    first_delay: float = 1.0
    max_delay: float = 30.0
    stable_after: float = 60.0

    def delay(self, ran_for: float, previous: float) -> float:
        if ran_for >= self.stable_after or previous <= 0:
            return self.first_delay
        return min(previous * 2, self.max_delay)


class Waker:
    """A self-pipe the main thread waits on; threads and signals write to it."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    @property
    def write_fd(self) -> int:
        return self._write

    def notify(self) -> None:
        # A full pipe already guarantees a wake-up; losing this byte is harmless.
        with contextlib.suppress(BlockingIOError):
            os.write(self._write, b"\0")

    def wait(self, timeout: float | None) -> None:
        select.select([self._read], [], [], timeout)
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 4096):
                pass

    def wait_until(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """Block until ``predicate()`` holds (True) or ``timeout`` passes (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not predicate():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            self.wait(remaining)
        return True

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


class Child:
    """One supervised process; its output goes to a log file (and stderr with ``echo``).

    A pump thread reads the output line by line, watches for ``ready`` and, at
    EOF, reaps the process; both events wake the main thread.
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        log_path: Path,
        ready: re.Pattern[str],
        waker: Waker,
        *,
        echo: bool = False,
        env: dict[str, str] | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.name = name
        #: SIGTERM it when this process dies, even by kill -9 (the combined mode's Redis: no orphan).
        self.die_with_parent = die_with_parent
        self.argv = argv
        self.log_path = log_path
        self.ready_pattern = ready
        self.echo = echo
        self.env = env
        self._waker = waker
        self.process: subprocess.Popen[bytes] | None = None
        self.ready: re.Match[str] | None = None
        self.exited = False
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._pump_thread: threading.Thread | None = None
        self.started_at = 0.0
        self.restarts = 0
        #: The wait before the last restart (0: never restarted), for the policy's doubling.
        self.last_delay = 0.0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    def start(self) -> None:
        self.ready = None
        self.exited = False
        self.started_at = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"==== {stamp} sluice up starts: {' '.join(self.argv)}\n".encode())
        log.flush()
        # Few malloc arenas: freed memory is reused and trimmed instead of pinned per thread
        # (docs/memory.md); an explicit MALLOC_ARENA_MAX in the environment wins.
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("MALLOC_ARENA_MAX", str(ARENA_MAX))
        self.process = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            process_group=0,
            # Safe with threads: it makes one system call, resolved before the fork.
            preexec_fn=_parent_death_signal() if self.die_with_parent else None,  # noqa: PLW1509
        )
        self._pump_thread = threading.Thread(
            target=self._pump, args=(log,), name=f"pump-{self.name}", daemon=True
        )
        self._pump_thread.start()

    def _pump(self, log: BinaryIO) -> None:
        assert self.process is not None
        assert self.process.stdout is not None
        with log:
            for raw in self.process.stdout:
                self.output(raw, log)
        self.process.stdout.close()
        self.process.wait()
        self.exited = True
        self._waker.notify()

    def output(self, raw: bytes, log: BinaryIO) -> None:
        """One line of the child's output: to its log (and stderr with ``echo``), watched for ``ready``."""
        log.write(raw)
        log.flush()
        line = raw.decode("utf-8", "replace")
        self.tail.append(line)
        if self.echo:
            sys.stderr.write(f"[{self.name}] {line}" if line.endswith("\n") else f"[{self.name}] {line}\n")
        if self.ready is None:
            match = self.ready_pattern.search(line)
            if match:
                self.ready = match
                self._waker.notify()

    def send(self, sig: signal.Signals) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    def join(self) -> None:
        """Wait for the pump to finish (the process is reaped by then)."""
        if self._pump_thread is not None:
            self._pump_thread.join()

    def restart(self) -> None:
        """Start the same command again (the previous process has exited and been reaped)."""
        self.join()
        self.restarts += 1
        self.start()

    def last_lines(self) -> str:
        return "".join(self.tail).rstrip("\n")


class Supervisor:
    """Starts children one by one and stops them in reverse order."""

    def __init__(self, grace: float) -> None:
        self.waker = Waker()
        self.grace = grace
        self.children: list[Child] = []
        self.signals: list[int] = []
        self._signal_times: list[float] = []

    # ---- signals -----------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.set_wakeup_fd(self.waker.write_fd, warn_on_full_buffer=False)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Only record it: the wakeup fd wakes the main thread.
        self._signal_times.append(time.monotonic())
        self.signals.append(signum)

    def restore_signal_handlers(self) -> None:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL if sig == signal.SIGTERM else signal.default_int_handler)

    # ---- running -----------------------------------------------------------------

    def start(self, child: Child, timeout: float) -> re.Match[str] | None:
        """Start ``child`` and wait for its ready line; None if a stop signal came first."""
        self.children.append(child)
        child.start()
        self.waker.wait_until(lambda: child.ready is not None or child.exited or bool(self.signals), timeout)
        if child.ready is not None:
            return child.ready
        if self.signals:
            return None
        if child.exited:
            raise CliError(
                "STARTUP_FAILED",
                f"{child.name} exited with code {child.returncode} before it was ready; "
                f"last lines of {child.log_path}:\n{child.last_lines()}",
            )
        raise CliError(
            "STARTUP_FAILED",
            f"{child.name} was not ready after {timeout:g}s; "
            f"last lines of {child.log_path}:\n{child.last_lines()}",
        )

    def wait(self, restart: RestartPolicy | None = None) -> Child | None:
        """Block until a stop signal (None) or, without a restart policy, a child exits on its own (it).

        With a policy, a child that exits is started again after the policy's delay, and this returns only
        on a stop signal. Restarts are not awaited for readiness: the others keep running meanwhile, as in a
        cluster.
        """
        pending: dict[Child, float] = {}  # child -> when to start it again

        def woken() -> bool:
            due = bool(pending) and min(pending.values()) <= time.monotonic()
            return bool(self.signals) or due or any(c.exited and c not in pending for c in self.children)

        while True:
            timeout = max(0.0, min(pending.values()) - time.monotonic()) if pending else None
            self.waker.wait_until(woken, timeout)
            if self.signals:
                return None
            for child in self.children:
                if child.exited and child not in pending:
                    if restart is None:
                        return child
                    ran_for = time.monotonic() - child.started_at
                    child.last_delay = restart.delay(ran_for, child.last_delay)
                    pending[child] = time.monotonic() + child.last_delay
                    _say(
                        f"{child.name} exited with code {child.returncode} after {ran_for:.1f} s; "
                        f"restarting in {child.last_delay:g} s"
                    )
            for child, at in list(pending.items()):
                if at <= time.monotonic():
                    del pending[child]
                    child.restart()
                    _say(f"{child.name} restarted (pid {child.pid}, restart {child.restarts})")

    def stop_all(self) -> None:
        """SIGTERM each child in reverse start order, SIGKILL after the grace period.

        A further SIGINT/SIGTERM (``HURRY_AFTER`` seconds after the first) skips the
        grace periods.
        """
        first = self._signal_times[0] if self._signal_times else time.monotonic()
        for child in reversed(self.children):
            if not child.started_at:
                continue
            if not child.exited:
                child.send(signal.SIGTERM)
                self.waker.wait_until(_exited_or_hurried(child, self._signal_times, first), self.grace)
                if not child.exited:
                    child.send(signal.SIGKILL)
            child.join()

    def close(self) -> None:
        self.restore_signal_handlers()
        self.waker.close()


def _say(message: str) -> None:
    """An event of the supervision (restarts), on stdout beside the banner; stderr is kept for errors."""
    sys.stdout.write(f"sluice up: {message}\n")
    sys.stdout.flush()


def _exited_or_hurried(child: Child, signal_times: list[float], first: float) -> Callable[[], bool]:
    return lambda: child.exited or (bool(signal_times) and signal_times[-1] - first >= HURRY_AFTER)


_PR_SET_PDEATHSIG = 1  # prctl(2)


def _parent_death_signal() -> Callable[[], None] | None:
    """What the child runs between fork and exec to get a SIGTERM when its parent dies (even by kill -9);
    None where there is no prctl (the child then outlives the parent, as in the separate mode). prctl is
    looked up here, in the parent: after a fork only the calling thread exists, and a lookup (dlopen)
    could wait for a lock another thread held."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
