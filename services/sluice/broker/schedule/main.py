"""``sluice scheduler``: the delayed-delivery service (creates the schedule topic, then runs a Scheduler).

One scheduler per cluster. Its state is a data directory (bucket files, the read checkpoint, the intent
log); the schedule topic is the source of truth, so a lost directory is rebuilt by reading the topic from
its start (its retention is the maximum delay plus a day). ``--clock-offset-file`` names a file holding a
number of ms added to the wall clock: the tests' injectable clock (days pass in seconds, across restarts).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sluice.broker.schedule.scheduler import Scheduler, SchedulerSettings
from sluice.client import Client
from sluice.client.producer.delay import SCHEDULE_TOPIC
from sluice.common.units import parse_duration
from sluice.errors import SluiceError, TopicAlreadyExists
from sluice.server.limits import raise_open_files_limit

__all__ = ["main"]

log = logging.getLogger("sluice.scheduler")

_DAY_MS = 86_400_000


def _ms(text: str) -> int:
    try:
        return int(parse_duration(text).total_seconds() * 1000)
    except SluiceError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sluice scheduler", description=__doc__.splitlines()[0])
    p.add_argument("--coordinator", required=True, help="the coordinator's host:port")
    p.add_argument("--data-dir", required=True, type=Path)
    p.add_argument("--partitions", type=int, default=4, help="schedule topic partitions (when creating it)")
    p.add_argument("--replication-factor", type=int, default=None)
    p.add_argument("--max-delay", type=_ms, default=7 * _DAY_MS, help="longest delay (default 7d)")
    p.add_argument("--bucket", type=_ms, default=10_000, help="fine time bucket width (default 10s)")
    p.add_argument("--preload", type=_ms, default=2_000, help="read a bucket this long before it starts")
    p.add_argument("--clock-offset-file", type=Path, default=None, help="tests: ms added to the wall clock")
    p.add_argument("--crash-after-deliveries", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def offset_clock(path: Path | None) -> Callable[[], int]:
    """Now in epoch ms, plus the offset in ``path`` (re-read when the file changes)."""
    if path is None:
        return lambda: time.time_ns() // 1_000_000
    cache: list[int] = [-1, 0]  # mtime_ns, offset

    def now() -> int:
        try:
            st = os.stat(path)
            if st.st_mtime_ns != cache[0]:
                cache[0], cache[1] = st.st_mtime_ns, int(path.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            pass
        return time.time_ns() // 1_000_000 + cache[1]

    return now


def ensure_topic(client: Client, args: argparse.Namespace) -> None:
    try:
        client.admin.create_topic(
            SCHEDULE_TOPIC,
            args.partitions,
            {"retention_ms": args.max_delay + _DAY_MS},
            replication_factor=args.replication_factor,
        )
        log.info("created %s with %d partitions", SCHEDULE_TOPIC, args.partitions)
    except TopicAlreadyExists:
        pass


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    raise_open_files_limit()  # as every Sluice process does: its bucket files and connections
    args = parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        client = Client(args.coordinator)
        ensure_topic(client, args)
        settings = SchedulerSettings(
            bucket_ms=args.bucket, preload_ms=args.preload, crash_after=args.crash_after_deliveries
        )
        scheduler = Scheduler(client, args.data_dir, settings, offset_clock(args.clock_offset_file))
        scheduler.start()
    except (SluiceError, OSError) as exc:  # an unreachable cluster, an unwritable data directory
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"SLUICE_READY service=scheduler address={args.coordinator} metrics=-", flush=True)
    while not stop.wait(10):
        log.info("delivered %d, in memory %d", scheduler.delivered, scheduler.pending_in_memory())
    scheduler.stop()
    client.close()
    return 0
