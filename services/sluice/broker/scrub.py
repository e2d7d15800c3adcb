"""A background scrub: slowly re-verify the CRC of every batch in sealed segments, so rot in data nobody
reads is found before it is needed (docs/replication.md, "The scrub").

A clean open does not verify sealed segments (seconds per GB at every restart), and a served read checks
only what it serves (``log/read_check.py``): a batch nobody reads (a follower's copy, old data) could rot
unseen until a failover made that replica the one to read from. The scrub reads every sealed segment
through the same path as a consumer (``PartitionLog.read``), so what it finds goes where a read's finding
goes: the batch is added to ``corrupt_ranges`` (never served), logged, and reported to the controller in
the next heartbeat (``damaged``), which takes the replica out of the ISR and moves leadership off it; the
replica then truncates below the damage and re-fetches it from the leader.

Cost, bounded by design: at most ``rate`` bytes/s (paced after each chunk of ``CHUNK_BYTES``), in a worker
thread, one log at a time; the CRC is one hardware CRC32C pass (about 0.2 ms per MB). Newly sealed segments
are picked up every ``IDLE_S``; a full pass over everything starts again every ``interval``. The active
segment is left out: it is verified by the recovery of an unclean open, and being written it is usually
in the page cache anyway. What it cannot see: a flip in a batch's base offset or leader epoch (outside the
CRC in format v2; one that breaks the framing stops the walk of that segment, found at the next unclean
open), and rot hidden by the page cache (a page read recently is served from memory).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from sluice.broker.log.manager import LogManager, TopicPartition
from sluice.broker.log.partition_log import PartitionLog
from sluice.errors import OffsetOutOfRange, SluiceError

__all__ = ["CHUNK_BYTES", "Scrubber"]

log = logging.getLogger(__name__)

#: Bytes read per step: small enough that pacing is smooth, large enough that a step is cheap.
CHUNK_BYTES = 256 * 1024
#: How often newly sealed segments are looked for once everything known is scrubbed.
IDLE_S = 10.0


class Scrubber:
    """Scrub the sealed segments of every log of ``logs`` at ``rate`` bytes/s (module doc)."""

    def __init__(
        self,
        logs: LogManager,
        rate: int,
        interval_s: float,
        *,
        on_bytes: Callable[[int], None] = lambda n: None,
        on_damage: Callable[[int], None] = lambda n: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logs = logs
        self._rate = rate
        self._interval_s = interval_s
        self._on_bytes = on_bytes
        self._on_damage = on_damage
        self._clock = clock
        #: The next offset to verify, per log: where the scrub stands in the current pass.
        self._next: dict[TopicPartition, int] = {}
        self._pass_started = clock()
        #: Completed full passes (tests and the log).
        self.passes = 0

    async def run(self) -> None:
        while True:
            scrubbed = await self.step()
            if scrubbed:
                await asyncio.sleep(scrubbed / self._rate)
                continue
            if self._clock() - self._pass_started >= self._interval_s:
                self.passes += 1
                log.info("scrub: pass %d over every sealed segment done; starting again", self.passes)
                self._next.clear()
                self._pass_started = self._clock()
                continue
            await asyncio.sleep(IDLE_S)

    async def step(self) -> int:
        """Verify one chunk of the first log with sealed data left in this pass; the bytes read (0:
        nothing left)."""
        for key, plog in self._logs.partitions().items():
            sealed_end = plog.segment_base_offsets()[-1]
            offset = max(self._next.get(key, 0), plog.log_start_offset)
            if offset >= sealed_end:
                continue
            before = len(plog.corrupt_ranges)
            try:
                offset, read = await asyncio.to_thread(_verify_chunk, plog, offset, sealed_end)
            except Exception:  # a log closed under it (deleted, moved away): never fatal to the scrub
                log.warning("scrub: %s/%d: skipped until the next pass", key[0], key[1], exc_info=True)
                offset, read = sealed_end, 0
            self._next[key] = offset
            found = len(plog.corrupt_ranges) - before
            if found > 0:
                log.error("scrub: %s/%d: %d damaged batch(es) found", key[0], key[1], found)
                self._on_damage(found)
            self._on_bytes(read)
            return max(read, 1)
        return 0


def _verify_chunk(plog: PartitionLog, offset: int, sealed_end: int) -> tuple[int, int]:
    """Read (and so verify) up to ``CHUNK_BYTES`` from ``offset``; where to go on, and the bytes read. A
    known damaged range is stepped over (a read starting in it is refused)."""
    for start, end in plog.corrupt_ranges:
        if start <= offset < end:
            return end, 0
    try:
        result = plog.read(offset, min(CHUNK_BYTES, plog.config.segment_bytes), min_one=True)
    except OffsetOutOfRange:
        return plog.log_start_offset, 0  # retention removed it meanwhile
    except (SluiceError, OSError) as err:
        if any(start <= offset < end for start, end in plog.corrupt_ranges):
            return offset, 0  # a damaged batch at ``offset``, found by this very read: stepped over next
        log.warning(
            "scrub: %s: cannot read at offset %d (%s); this log waits for the next pass",
            plog.directory,
            offset,
            err,
        )
        return sealed_end, 0
    if not result.data:
        return sealed_end, 0
    return min(result.next_offset, sealed_end) if result.next_offset > offset else sealed_end, len(
        result.data
    )
