"""A storage fault seam for power loss: a durability ledger recorded beside a real process, and a cut that
brings a data directory back to what that ledger says was made durable (docs/replication.md, "Power loss
and corruption").

Why not LazyFS: it needs a FUSE mount (``fusermount``, libfuse) that this machine does not have. The seam
gives the same fault from the other side of the syscall: ``python -m tests.chaos.fsync_ledger LEDGER MODULE
ARGS...`` wraps ``os.fsync`` and ``os.fdatasync`` in the process (before any module binds them) and runs
MODULE (``sluice``) as ``__main__``. Every sync appends one JSON line to LEDGER, written with one
``write(2)`` on an ``O_APPEND`` descriptor, so a ``kill -9`` leaves every line of a sync that returned:

- a regular file: its inode and its size *before* the sync (what was written before the call is durable
  after it; a write racing the sync may or may not be, so it is counted as lost: the conservative side);
- a directory: its inode and its entries at the sync (a name created or renamed into it is durable once
  such a sync saw it).

Keys are inodes, not paths, so a file written under a temporary name, fsynced and renamed keeps its
durable length. :func:`power_cut`, after the process was killed, applies POSIX's worst case: a name not in
its directory's last synced listing is removed (a directory never synced since the baseline keeps
nothing), and a file is cut back to its last synced size (0 if never synced). Then the ledger restarts
from the state left, which is what the disk holds after the power comes back.

Limits, on the optimistic side, stated so that nobody reads more into a passing test: a file removed or
renamed away without a directory sync does not come back (a real disk may resurrect it), and bytes
overwritten in place below a synced length keep their new content.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

__all__ = ["baseline", "install", "power_cut"]

Key = tuple[int, int]


def _key(st: os.stat_result) -> Key:
    return (st.st_dev, st.st_ino)


def install(ledger: Path) -> None:
    """Wrap this process's ``os.fsync`` and ``os.fdatasync`` so that every sync is recorded in ``ledger``."""
    out = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def entry(fd: int) -> bytes | None:
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                path = os.readlink(f"/proc/self/fd/{fd}")
                return json.dumps({"dir": _key(st), "entries": sorted(os.listdir(path))}).encode() + b"\n"
            if stat.S_ISREG(st.st_mode):
                return json.dumps({"file": _key(st), "size": st.st_size}).encode() + b"\n"
        except OSError:
            return None
        return None

    def recorded(real: Any) -> Any:
        def sync(fd: Any) -> None:
            fd = fd if isinstance(fd, int) else fd.fileno()
            line = entry(fd)  # taken before the sync: only what was there when it began is counted
            real(fd)
            if line is not None:
                os.write(out, line)

        return sync

    os.fsync = recorded(real_fsync)
    os.fdatasync = recorded(real_fdatasync)


def baseline(root: Path, ledger: Path) -> None:
    """Start ``ledger`` afresh: everything under ``root`` now is durable (a disk after a power cycle)."""
    lines: list[str] = []
    for dirpath, _dirs, files in os.walk(root):
        lines.append(json.dumps({"dir": _key(os.stat(dirpath)), "entries": sorted(os.listdir(dirpath))}))
        for name in files:
            st = os.stat(os.path.join(dirpath, name))
            lines.append(json.dumps({"file": _key(st), "size": st.st_size}))
    ledger.write_text("".join(line + "\n" for line in lines))


def _read(ledger: Path) -> tuple[dict[Key, int], dict[Key, set[str]]]:
    sizes: dict[Key, int] = {}
    listings: dict[Key, set[str]] = {}
    for line in ledger.read_text().splitlines():
        if not line.endswith("}"):
            continue  # a line cut by the kill: its sync may not have returned
        rec = json.loads(line)
        if "file" in rec:
            sizes[(rec["file"][0], rec["file"][1])] = rec["size"]
        else:
            listings[(rec["dir"][0], rec["dir"][1])] = set(rec["entries"])
    return sizes, listings


def power_cut(root: Path, ledger: Path) -> dict[str, int]:
    """Bring ``root`` (a stopped process's data directory) back to what ``ledger`` says was synced.

    Returns what was lost: ``removed`` names and ``cut_bytes``; the ledger then restarts from what is left.
    """
    sizes, listings = _read(ledger)
    lost = {"removed": 0, "cut_bytes": 0, "files_cut": 0}

    def walk(directory: Path) -> None:
        kept = listings.get(_key(os.stat(directory)), set())
        for child in sorted(directory.iterdir()):
            if child.name not in kept:
                lost["removed"] += 1
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            elif child.is_dir():
                walk(child)
            else:
                st = child.stat()
                durable = min(sizes.get(_key(st), 0), st.st_size)
                if durable < st.st_size:
                    os.truncate(child, durable)
                    lost["cut_bytes"] += st.st_size - durable
                    lost["files_cut"] += 1

    walk(root)
    baseline(root, ledger)
    return lost


def main() -> None:
    """``python -m tests.chaos.fsync_ledger LEDGER MODULE [ARGS...]``: MODULE runs as ``__main__``."""
    ledger, module, *args = sys.argv[1:]
    install(Path(ledger))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
