"""Read-only verification of partition logs on disk: what ``sluice broker verify DIR`` runs.

Opening a log (``PartitionLog``) repairs it: torn tails are cut, indexes rebuilt. Verification must not
change what it reports on, so it reads the files directly, never writes, and checks per segment:

- framing: the file is whole batches back to back, to its last byte (no torn or garbage tail);
- every batch (``validate_batch``: CRC, counts, column sums);
- offsets: the first batch starts at the segment's base (its file name), batches are dense, and each
  segment starts where the previous one ended; leader epochs never go down;
- the offset index: whole entries, strictly increasing, each naming the position of the batch holding
  exactly that relative offset; the time index: whole entries, increasing, each naming a batch start
  with a timestamp no lower than the records up to it.

Index problems are reported as such: the broker rebuilds indexes at open, data damage it cannot.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from sluice.broker.log.config import MAX_SEGMENT_BYTES
from sluice.broker.log.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from sluice.broker.log.walk import walk_batches
from sluice.codec.batch import validate_batch
from sluice.errors import SluiceError

_OFFSET_ENTRY = struct.Struct("<II")
_TIME_ENTRY = struct.Struct("<qI")
#: Directories a broker is deleting (``manager.DELETED_PREFIX``): not verified.
_DELETED_PREFIX = "~deleted-"


@dataclass
class PartitionReport:
    directory: Path
    segments: int = 0
    batches: int = 0
    records: int = 0
    start_offset: int | None = None
    end_offset: int | None = None
    #: Damage to the data itself (a replica must re-fetch it, or it is lost).
    errors: list[str] = field(default_factory=list)
    #: Wrong or torn index files (the broker rebuilds them at open).
    index_errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and not self.index_errors


@dataclass
class _Batch:
    position: int
    base_offset: int
    next_offset: int
    running_max_ts: int


def _segment_bases(directory: Path) -> list[int]:
    bases = []
    for name in os.listdir(directory):
        stem, dot, suffix = name.partition(".")
        if dot and "." + suffix == LOG_SUFFIX and stem.isdigit():
            bases.append(int(stem))
    return sorted(bases)


def partition_dirs(root: Path) -> list[Path]:
    """``root`` itself if it holds segments, else its partition subdirectories (sorted)."""
    if _segment_bases(root):
        return [root]
    return sorted(
        p
        for p in root.iterdir()
        if p.is_dir()
        and not p.name.startswith(_DELETED_PREFIX)
        and (_segment_bases(p) or (p / "partition.json").exists())
    )


def _check_batches(
    path: Path, base: int, report: PartitionReport, last_epoch: int
) -> tuple[list[_Batch], int]:
    """Walk and validate every batch of one segment file; returns its batches and the last leader epoch."""
    size = path.stat().st_size
    batches: list[_Batch] = []
    expected, end, running_max = base, 0, -(2**63)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for pos, header, buf, off in walk_batches(fd, 0, size, need_body=True):
            end = pos + header.length
            where = f"{path.name} at byte {pos} (offset {header.base_offset})"
            try:
                validate_batch(buf, off, MAX_SEGMENT_BYTES)
            except SluiceError as exc:
                report.errors.append(f"{where}: corrupt batch: {exc.message}")
            if header.base_offset != expected:
                report.errors.append(f"{where}: offsets not dense, expected base offset {expected}")
            if header.partition_leader_epoch < last_epoch:
                report.errors.append(
                    f"{where}: leader epoch {header.partition_leader_epoch} after epoch {last_epoch}"
                )
            last_epoch = max(last_epoch, header.partition_leader_epoch)
            running_max = max(running_max, header.max_timestamp)
            batches.append(_Batch(pos, header.base_offset, header.next_offset, running_max))
            report.records += header.record_count
            expected = header.next_offset
    finally:
        os.close(fd)
    if end != size:
        report.errors.append(
            f"{path.name}: {size - end} bytes after the last whole batch (byte {end} of {size}): "
            "a torn or garbage tail (a broker cuts it at open; whatever it held was never acknowledged "
            "if the broker wrote it)"
        )
    report.batches += len(batches)
    return batches, last_epoch


def _entries(path: Path, entry: struct.Struct, report: PartitionReport) -> list[tuple[int, int]] | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) % entry.size:
        report.index_errors.append(f"{path.name}: {len(raw)} bytes is not a whole number of entries")
        raw = raw[: len(raw) - len(raw) % entry.size]
    return [entry.unpack_from(raw, i) for i in range(0, len(raw), entry.size)]


def _check_indexes(
    directory: Path, stem: str, base: int, batches: list[_Batch], report: PartitionReport
) -> None:
    by_position = {b.position: b for b in batches}
    by_rel = {b.base_offset - base: b for b in batches}
    offsets = _entries(directory / (stem + INDEX_SUFFIX), _OFFSET_ENTRY, report)
    prev = (-1, 0)
    for rel, pos in offsets or ():
        name = f"{stem}{INDEX_SUFFIX}: entry ({rel}, {pos})"
        if rel <= prev[0] or pos <= prev[1]:
            report.index_errors.append(f"{name} does not increase")
        batch = by_position.get(pos)
        if batch is None or batch.base_offset != base + rel:
            report.index_errors.append(f"{name} does not name a batch starting at that offset")
        prev = (rel, pos)
    times = _entries(directory / (stem + TIME_INDEX_SUFFIX), _TIME_ENTRY, report)
    prev_ts, prev_rel = -(2**63), -1
    for ts, rel in times or ():
        name = f"{stem}{TIME_INDEX_SUFFIX}: entry ({ts}, {rel})"
        if ts <= prev_ts or rel <= prev_rel:
            report.index_errors.append(f"{name} does not increase")
        batch = by_rel.get(rel)
        if batch is None:
            report.index_errors.append(f"{name} does not name a batch start")
        elif ts < batch.running_max_ts:
            report.index_errors.append(
                f"{name} is below the records' timestamps up to it ({batch.running_max_ts})"
            )
        prev_ts, prev_rel = ts, rel


def verify_partition(directory: Path) -> PartitionReport:
    """Check every segment of one partition directory (read-only)."""
    report = PartitionReport(directory)
    bases = _segment_bases(directory)
    if not bases:
        report.errors.append("no segment files")
        return report
    expected: int | None = None
    last_epoch = -1
    for base in bases:
        stem = f"{base:020d}"
        if expected is not None and base != expected:
            report.errors.append(
                f"{stem}{LOG_SUFFIX}: starts at offset {base}, the previous segment ended at {expected}"
            )
        batches, last_epoch = _check_batches(directory / (stem + LOG_SUFFIX), base, report, last_epoch)
        _check_indexes(directory, stem, base, batches, report)
        expected = batches[-1].next_offset if batches else base
        report.segments += 1
    report.start_offset, report.end_offset = bases[0], expected
    return report
