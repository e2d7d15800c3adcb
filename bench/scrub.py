"""What the background scrub costs (broker/scrub.py; docs/replication.md, "The scrub").

Builds a partition log of ``--mb`` MB of sealed segments (random values, batches of 100 records, 16 MB
segments) in a temporary directory, then runs the scrub's steps unpaced over all of it and reports the
verified MB/s and the CPU seconds per MB (process time, the page cache warm: the CPU part of the cost; at
the default 4 MiB/s pace, CPU per MB x 4 is the fraction of a core it takes). Several rounds, since the
machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from sluice.broker.log import LogConfig
from sluice.broker.log.manager import LogManager
from sluice.broker.scrub import Scrubber
from sluice.codec.batch import BatchBuilder


def build(directory: Path, mb: int) -> LogManager:
    logs = LogManager(directory, LogConfig(segment_bytes=16 << 20, retention_ms=-1))
    plog = logs.create("scrub", "tid", 0)
    written = 0
    while written < mb << 20:
        b = BatchBuilder()
        for i in range(100):
            b.append(os.urandom(200), b"k%d" % i, None, None, 1_000 + i)
        batch = b.build()
        plog.append(batch)
        written += len(batch)
    plog.flush()
    return logs


async def scrub_all(scrubber: Scrubber) -> int:
    total = 0
    while n := await scrubber.step():
        total += n
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        logs = build(Path(tmp), args.mb)
        for r in range(args.rounds):
            scrubber = Scrubber(logs, 1 << 40, 3600.0)
            wall, cpu = time.perf_counter(), time.process_time()
            scrubbed = asyncio.run(scrub_all(scrubber))
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            mb = scrubbed / (1 << 20)
            print(
                f"round {r + 1}: {mb:.0f} MB verified in {wall:.2f} s: {mb / wall:.0f} MB/s, "
                f"{cpu / mb * 1000:.2f} ms CPU per MB ({cpu / mb * 4 * 100:.2f}% of a core at 4 MiB/s)"
            )
        logs.close()


if __name__ == "__main__":
    main()
