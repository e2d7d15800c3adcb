"""Opening a partition directory: format upgrade, segment checks, crash recovery.

Caller: ``PartitionLog`` on open. The design is in docs/storage.md ("Crash recovery") and
docs/replication.md ("Recovery").
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from sluice.broker.log.handles import ReadHandles
from sluice.broker.log.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    Segment,
    delete_segment_files,
    segment_stem,
)
from sluice.broker.log.upgrade import upgrade_directory

log = logging.getLogger(__name__)

_STEM_DIGITS = 20


@dataclass(slots=True)
class LoadedLog:
    #: Sealed segments (descriptors released), then the active one.
    segments: list[Segment]
    #: Segment files were created or removed: the directory needs an fsync.
    dir_dirty: bool


def segment_bases(directory: Path) -> list[int]:
    """Base offsets of the segment files in ``directory``, sorted; removes orphaned index files."""
    bases: list[int] = []
    for path in directory.iterdir():
        stem, suffix = path.stem, path.suffix
        if len(stem) != _STEM_DIGITS or not stem.isdigit():
            continue
        if suffix == LOG_SUFFIX:
            bases.append(int(stem))
        elif suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX) and not path.with_suffix(LOG_SUFFIX).exists():
            path.unlink()  # left by a retention delete interrupted by a crash
    bases.sort()
    return bases


def load_segments(
    directory: Path, handles: ReadHandles, interval: int, verify_all: bool = False
) -> LoadedLog:
    """Open every segment of ``directory`` (converting format-1 segments first).

    ``verify_all``, after an unclean shutdown: every batch of every segment is validated, CRC
    included (a clean open checks each segment's tail only). A failing batch with intact
    framing and valid batches after it is kept and listed (``LoadedLog.corrupt``); failing
    batches at a segment's end are a torn tail, cut as in any recovery.
    """
    bases = segment_bases(directory)
    # Segments written before batch format 2 are converted first (docs/replication.md).
    stems = [segment_stem(b) for b in bases]
    dir_dirty = bool(upgrade_directory(directory, stems, (INDEX_SUFFIX, TIME_INDEX_SUFFIX)))
    if not bases:
        return LoadedLog([Segment.create(directory, 0, handles)], True)
    segments, dropped = _open_segments(directory, handles, bases, interval, verify_all)
    return LoadedLog(segments, dir_dirty or dropped)


def _open_segments(
    directory: Path, handles: ReadHandles, bases: list[int], interval: int, verify_all: bool
) -> tuple[list[Segment], bool]:
    """Load sealed segments one at a time (one descriptor open at once, closed after the
    check), then recover the last one as the active segment. Returns the segments and whether
    later segments were dropped."""
    segments: list[Segment] = []
    dropped = False
    for i, base in enumerate(bases):
        seg = Segment.open(directory, base, handles)
        try:
            if i + 1 < len(bases):
                if seg.load_sealed(bases[i + 1], interval, verify_all):
                    os.close(seg.release_fd())
                    segments.append(seg)
                    continue
                # A closed segment lost its tail (power loss before an fsync): nothing
                # after it can have been acknowledged, and keeping it would leave a gap.
                for later in bases[i + 1 :]:
                    log.warning("dropping segment %d of %s after a torn segment", later, directory)
                    delete_segment_files(directory, later)
                dropped = True
            if verify_all:
                seg.corrupt.clear()  # a torn sealed segment is verified again as the active one
            seg.recover(interval, verify_all)
        except BaseException:
            seg.close()
            raise
        segments.append(seg)
        break
    return segments, dropped
