"""Durable small-file writes for the broker's side files (epoch checkpoint, producer snapshots, partition
metadata): the one place that knows the write, fsync, rename, fsync-the-directory sequence.

Why all four steps: without the file's fsync a crash can leave the renamed name pointing at empty or partial
data; without the directory's fsync the rename itself can be lost, so the old file comes back.
"""

from __future__ import annotations

import os
from pathlib import Path

from sluice.broker.log import fileops


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (creations, renames, deletions) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fdatasync_path(path: Path) -> None:
    """fdatasync a closed file by path (fsync applies to the file, whichever descriptor asks); a file
    deleted meanwhile has nothing left to sync."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def replace_durably(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old file or the new one, whole."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        fileops.write_all(fd, data)
        os.fsync(fd)
    except OSError:
        os.close(fd)
        # A half-written temporary file would hold the space a full disk needs back.
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
