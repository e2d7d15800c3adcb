"""Free space of a broker's log directory, and the guard that refuses writes before the disk is full.

Why refuse early (Redpanda's ``storage_min_free_bytes``, Kafka's log-dir failure seen from the other side):
a log that runs into ``ENOSPC`` mid-append can still be kept whole (the append is cut back), but the
files that make it cheap to reopen (indexes, the leader-epoch checkpoint, producer snapshots) and the
clean-shutdown marker need a little space too. So appends stop while free space is below a minimum,
and everything else keeps its room.

Cost: ``check`` runs on every append and does no syscall in the common case. It keeps the ``statvfs``
figure of the last refresh and subtracts the bytes appended since; ``statvfs`` runs again only when
that estimate says the minimum is near, when ``refresh_s`` has passed, or when ``refresh_bytes`` have been
written since (other writers share the disk: the estimate alone would drift). Under the minimum, the
refusal itself refreshes at most every ``refused_refresh_s``, which is how writes resume by themselves,
in the same process, once space is freed.

Thread-safety: plain attribute updates under the GIL; the metrics thread may call ``refresh``/``stats``
while the event loop appends (a race costs at most one extra ``statvfs``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sluice.errors import StorageFull

log = logging.getLogger(__name__)

#: Default minimum of free bytes below which a broker refuses appends: one default segment. Redpanda
#: reserves 5 GiB (or 5%); a broker's side files need megabytes, and a small volume keeps most of its room.
DEFAULT_MIN_FREE_BYTES = 128 * 1024 * 1024
#: Without a guard, one error line per this many seconds of ENOSPC (not one per refused append).
NO_SPACE_LOG_S = 10.0


@dataclass(frozen=True)
class DiskStats:
    """One log directory's space, for metrics: as of the last ``statvfs``."""

    log_dir: str
    free_bytes: int
    total_bytes: int
    min_free_bytes: int
    refusals: int


def _statvfs_free_total(path: Path) -> tuple[int, int]:
    st = os.statvfs(path)
    # f_bavail: what an unprivileged writer may use (the root reserve is not ours to count on).
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


class DiskSpace:
    """Free-space guard of one log directory (shared by every partition log in it)."""

    def __init__(
        self,
        directory: Path,
        min_free_bytes: int = DEFAULT_MIN_FREE_BYTES,
        refresh_s: float = 5.0,
        refresh_bytes: int = 64 * 1024 * 1024,
        refused_refresh_s: float = 0.5,
        probe: Callable[[Path], tuple[int, int]] = _statvfs_free_total,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if min_free_bytes < 0:
            raise ValueError(f"min_free_bytes must be >= 0, got {min_free_bytes}")
        self.directory = Path(directory)
        self.min_free_bytes = min_free_bytes
        self.refresh_s = refresh_s
        self.refresh_bytes = refresh_bytes
        self.refused_refresh_s = refused_refresh_s
        self._probe = probe
        self._clock = clock
        self.free_bytes = 0
        self.total_bytes = 0
        self._written = 0  # bytes appended since the last refresh
        self._refreshed_at = float("-inf")
        #: Appends refused for space (a counter for metrics).
        self.refusals = 0
        self.full = False
        self._no_space_logged_at = float("-inf")
        self.refresh()

    def refresh(self) -> int:
        """``statvfs`` now; returns the free bytes. A failing ``statvfs`` keeps the old figure."""
        try:
            self.free_bytes, self.total_bytes = self._probe(self.directory)
        except OSError as exc:
            log.warning("statvfs of %s failed: %s", self.directory, exc)
        self._written = 0
        self._refreshed_at = self._clock()
        full = self.free_bytes < self.min_free_bytes
        if full != self.full:
            self.full = full
            if full:
                log.error(
                    "%s: %d bytes free, below the minimum of %d: produce is refused (STORAGE_FULL) "
                    "until space is freed; reads go on",
                    self.directory,
                    self.free_bytes,
                    self.min_free_bytes,
                )
            else:
                log.warning("%s: %d bytes free again: produce is accepted", self.directory, self.free_bytes)
        return self.free_bytes

    def check(self, nbytes: int) -> None:
        """Raise StorageFull if appending ``nbytes`` would leave less than the minimum free.

        No syscall unless the cached figure is stale or says the minimum is near (module docstring).
        A minimum of 0 disables the guard: appends then run into the real ENOSPC (cut back, typed).
        """
        if not self.min_free_bytes:
            return
        estimate = self.free_bytes - self._written - nbytes
        now = self._clock()
        stale = now - self._refreshed_at >= (self.refused_refresh_s if self.full else self.refresh_s)
        if stale or self._written >= self.refresh_bytes or (estimate < self.min_free_bytes and not self.full):
            self.refresh()
            estimate = self.free_bytes - nbytes
        if estimate < self.min_free_bytes:
            self.refusals += 1
            raise StorageFull(
                f"the log directory {self.directory} has {max(self.free_bytes - self._written, 0)} bytes "
                f"free, the minimum is {self.min_free_bytes}: writes are refused until space is freed "
                "(reads go on)"
            )

    def wrote(self, nbytes: int) -> None:
        """Account for ``nbytes`` appended (no syscall)."""
        self._written += nbytes

    def hit_no_space(self) -> None:
        """A write met ENOSPC: the figure is wrong; refuse from now on until a refresh says otherwise."""
        if not self.min_free_bytes:  # no guard: every append tries (and a failed one is cut back)
            now = self._clock()
            if now - self._no_space_logged_at >= NO_SPACE_LOG_S:
                self._no_space_logged_at = now
                log.error(
                    "%s: the disk is full: appends fail (STORAGE_FULL) until space is freed", self.directory
                )
            return
        self.refresh()
        if not self.full:
            # statvfs still shows room (reserved blocks, another writer freed some meanwhile): trust the
            # error, not the figure, until the next scheduled refresh.
            self.full = True
            self.free_bytes = min(self.free_bytes, self.min_free_bytes - 1)

    def stats(self) -> DiskStats:
        """Refreshes (a scrape is rare) and reports: the metrics source."""
        self.refresh()
        return DiskStats(
            str(self.directory), self.free_bytes, self.total_bytes, self.min_free_bytes, self.refusals
        )
