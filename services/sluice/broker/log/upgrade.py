"""Upgrade of a partition directory written before batch format 2: segments converted in place.

A broker opening a directory whose segments hold format-1 batches rewrites each such segment in
format 2 before anything else reads it (leader epoch 0, producer fields -1, CRC recomputed; the
records, offsets and append times are unchanged), and drops its indexes, which recovery then
rebuilds (every batch grows by 18 bytes, so every position moves).

Crash safety, per segment: the converted copy is written to ``<base>.log.v2tmp`` and fsynced, the
indexes are removed, then the copy is renamed over the ``.log`` and the directory fsynced. A crash
before the rename leaves the format-1 file (and a stale temporary file, overwritten by the next
try): the next open converts it again. A crash after it leaves the format-2 file with no indexes:
recovery rebuilds them. So a restart always finishes the job, and converting twice is a no-op (a
segment whose first batch is format 2 is left alone). A segment is all one format: only this
module ever writes format 1 out of a log, and it writes whole files.

A torn or corrupt tail of a format-1 segment is not carried over (a conversion never gives a
damaged batch a fresh, valid CRC): the copy ends at the last whole, CRC-valid batch, which is
what recovery would have kept. Caller: ``PartitionLog`` on open. Decision: docs/replication.md,
"Batch format version 2".
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from sluice.broker.log.durable import fsync_dir
from sluice.broker.log.handles import storage_error
from sluice.codec.batch import MAGIC_AT
from sluice.codec.batch.v1 import V1_HEADER_SIZE, is_v1, upgrade_v1, v1_length

log = logging.getLogger(__name__)

TMP_SUFFIX = ".v2tmp"
#: Bytes read at once while converting (a batch larger than this is read whole).
_CHUNK = 1 << 22
_LENGTH_AT = 8


def needs_upgrade(path: Path) -> bool:
    """Whether the segment file ``path`` holds format-1 batches (its first batch's magic)."""
    with open(path, "rb") as f:
        head = f.read(MAGIC_AT + 1)
    return is_v1(head)


def upgrade_directory(directory: Path, stems: list[str], index_suffixes: tuple[str, ...]) -> int:
    """Convert every format-1 segment among ``<stem>.log`` in ``directory``; returns how many.

    ``index_suffixes`` names the derived files removed with each converted segment.
    """
    converted = 0
    for stem in stems:
        path = directory / f"{stem}.log"
        tmp = directory / f"{stem}.log{TMP_SUFFIX}"
        try:
            if not needs_upgrade(path):
                tmp.unlink(missing_ok=True)  # left by a try that crashed before its rename
                continue
            kept, dropped = _convert(path, tmp)
            for suffix in index_suffixes:
                (directory / f"{stem}{suffix}").unlink(missing_ok=True)
            os.replace(tmp, path)
            fsync_dir(directory)
        except OSError as exc:
            raise storage_error(f"converting {path} to batch format 2", exc) from exc
        converted += 1
        if dropped:
            log.warning("%s: %d bytes after the last valid format-1 batch were not converted", path, dropped)
        log.info("converted %s to batch format 2 (%d batches)", path, kept)
    return converted


def _convert(path: Path, tmp: Path) -> tuple[int, int]:
    """Write the format-2 copy of ``path`` to ``tmp`` and fsync it; (batches, bytes not converted)."""
    batches = 0
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        fd = src.fileno()
        size = os.fstat(fd).st_size
        pos = 0  # source bytes converted so far
        while pos < size:
            buf = os.pread(fd, _CHUNK, pos)
            first = _claimed_length(buf)
            if first is not None and len(buf) < first <= size - pos:
                buf = os.pread(fd, first, pos)  # one batch larger than a chunk: read it whole
            off, out = 0, []
            # v1_length is None at a batch running past the buffer (read again from there) and
            # at a torn or corrupt one (then nothing is converted from there: the tail stops).
            while (length := v1_length(buf, off)) is not None:
                out.append(upgrade_v1(buf, off, leader_epoch=0))
                off += length
            dst.write(b"".join(out))
            batches += len(out)
            if off == 0:
                break
            pos += off
        dst.flush()
        os.fsync(dst.fileno())
    return batches, size - pos


def _claimed_length(buf: bytes) -> int | None:
    """The length the batch at the start of ``buf`` claims; None if its header is not there."""
    if len(buf) < V1_HEADER_SIZE:
        return None
    return int.from_bytes(buf[_LENGTH_AT : _LENGTH_AT + 4], "little", signed=True)
