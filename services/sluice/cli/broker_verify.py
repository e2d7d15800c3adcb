"""``sluice broker verify DIR``: check a broker's partition logs on disk, read-only.

DIR is a broker's data directory (every partition under it) or one partition's directory. Each batch's
framing and CRC, dense offsets within and across segments, non-decreasing leader epochs and both index
files are checked (``sluice.broker.log.verify``). Safe on a running broker's directory (nothing is
written), though batches appended meanwhile may show as a torn tail; stop the broker for a clean verdict.

Exit status: 0 all intact; 1 damage found (each item on stderr, data damage and rebuildable index damage
told apart); 2 usage error (no such directory, no partition in it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sluice.broker.log.verify import PartitionReport, partition_dirs, verify_partition

#: Items printed per partition and kind before "... and N more".
MAX_ITEMS = 20


def _print_items(kind: str, items: list[str]) -> None:
    for item in items[:MAX_ITEMS]:
        print(f"  {kind}: {item}", file=sys.stderr)
    if len(items) > MAX_ITEMS:
        print(f"  ... and {len(items) - MAX_ITEMS} more {kind} item(s)", file=sys.stderr)


def _summary(report: PartitionReport) -> str:
    return (
        f"{report.directory.name}: {report.segments} segment(s), {report.batches} batch(es), "
        f"{report.records} record(s), offsets [{report.start_offset}, {report.end_offset})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sluice broker verify",
        description="Verify a broker's partition logs on disk (read-only): batch CRCs, offsets, indexes.",
    )
    parser.add_argument("dir", type=Path, help="a broker data directory, or one partition's directory")
    args = parser.parse_args(argv)
    root: Path = args.dir
    if not root.is_dir():
        print(f"sluice broker verify: {root} is not a directory", file=sys.stderr)
        return 2
    try:
        dirs = partition_dirs(root)
    except OSError as exc:
        print(f"sluice broker verify: cannot list {root}: {exc}", file=sys.stderr)
        return 2
    if not dirs:
        print(f"sluice broker verify: no partition logs under {root}", file=sys.stderr)
        return 2
    damaged = 0
    for directory in dirs:
        try:
            report = verify_partition(directory)
        except OSError as exc:
            report = PartitionReport(directory, errors=[f"cannot read: {exc}"])
        if report.ok:
            print(f"ok       {_summary(report)}")
            continue
        damaged += 1
        print(f"DAMAGED  {_summary(report)}")
        _print_items("data", report.errors)
        _print_items("index (rebuilt by the broker at open)", report.index_errors)
    print(f"{len(dirs)} partition(s) verified, {damaged} damaged")
    return 1 if damaged else 0
