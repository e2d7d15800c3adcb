"""The power-loss seam's fault mode, tested (``tests/chaos/fsync_ledger.py``): a real process writes files
under the recording wrapper and dies by ``kill -9``; the cut keeps exactly what was synced.

Run as ``__main__`` (by the wrapper), this module is that process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.chaos.fsync_ledger import baseline, power_cut

ROOT = Path(__file__).resolve().parents[2]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _probe(root: Path) -> None:
    """Write, sync some of it, and die without a goodbye."""
    sub = root / "part-0"
    sub.mkdir()
    with open(sub / "kept.log", "wb") as f:
        f.write(b"a" * 100)
        f.flush()
        os.fdatasync(f.fileno())  # 100 bytes durable ...
        f.write(b"b" * 50)  # ... these 50 are only in the page cache
        f.flush()
    with open(sub / "snapshot.tmp", "wb") as f:
        f.write(b"s" * 30)
        f.flush()
        os.fsync(f.fileno())
    os.rename(sub / "snapshot.tmp", sub / "snapshot")  # renamed after its sync: keeps its 30 bytes
    (sub / "unsynced").write_bytes(b"u" * 10)  # named in the directory sync below, never synced itself
    _fsync_dir(sub)
    _fsync_dir(root)
    (sub / "late.log").write_bytes(b"l" * 20)  # created after the last directory sync
    (root / "late-dir").mkdir()
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_power_cut_keeps_what_was_synced_and_drops_the_rest(tmp_path: Path) -> None:
    root, ledger = tmp_path / "data", tmp_path / "ledger"
    root.mkdir()
    (root / "old").write_bytes(b"o" * 7)  # there before the process: durable
    baseline(root, ledger)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.chaos.fsync_ledger", str(ledger), __name__, str(root)],
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL
    sub = root / "part-0"
    assert (sub / "kept.log").stat().st_size == 150  # the page cache survived the kill ...

    lost = power_cut(root, ledger)  # ... not the power cut

    assert (sub / "kept.log").read_bytes() == b"a" * 100  # synced: kept; not synced: cut
    assert (sub / "snapshot").read_bytes() == b"s" * 30
    assert (sub / "unsynced").read_bytes() == b""
    assert not (sub / "late.log").exists()
    assert not (root / "late-dir").exists()
    assert (root / "old").read_bytes() == b"o" * 7
    assert lost == {"removed": 2, "cut_bytes": 60, "files_cut": 2}
    # The ledger restarted from what is left: a second cut changes nothing.
    assert power_cut(root, ledger) == {"removed": 0, "cut_bytes": 0, "files_cut": 0}


def test_a_directory_never_synced_keeps_nothing(tmp_path: Path) -> None:
    root, ledger = tmp_path / "data", tmp_path / "ledger"
    root.mkdir()
    baseline(root, ledger)
    (root / "p").mkdir()
    _fsync_dir(root)  # not recorded: this process is not wrapped, so the cut drops even the name
    (root / "p" / "f").write_bytes(b"x")
    assert power_cut(root, ledger)["removed"] == 1
    assert list(root.iterdir()) == []


if __name__ == "__main__":
    _probe(Path(sys.argv[1]))
