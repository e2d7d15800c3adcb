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
from sluice.common.backoff import Backoff
from sluice.common.units import parse_duration
from sluice.errors import InvalidArgument, SluiceError, TopicAlreadyExists
from sluice.security.tls import ServerTLS
from sluice.server.embedded import current_host, say
from sluice.server.http import start_http
from sluice.server.limits import raise_open_files_limit
from sluice.server.metrics import set_build_info

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
    p.add_argument("--metrics-host", default="127.0.0.1", help="address of /metrics and /healthz")
    p.add_argument("--metrics-port", type=int, default=None, help="port of /metrics and /healthz (0: any)")
    p.add_argument("--tls-metrics-cert", type=Path, default=None, help="serve /metrics over TLS with this")
    p.add_argument("--tls-metrics-key", type=Path, default=None, help="the key of --tls-metrics-cert")
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


#: How long start-up waits for the cluster (a coordinator or broker starting beside it, or a moment of
#: overload) before it gives up: as long as a Kubernetes start-up probe would, not for ever.
STARTUP_WAIT_S = 60.0


def _until_reachable(step: Callable[[], None], stop: threading.Event) -> None:
    """Run ``step``, again after a retriable error (the cluster not reachable yet), for at most
    STARTUP_WAIT_S; the last error then, or any other at once, is raised."""
    deadline = time.monotonic() + STARTUP_WAIT_S
    backoff = Backoff(0.2, 5.0)
    while True:
        try:
            step()
            return
        except SluiceError as exc:
            wait = backoff.next()
            if not exc.retriable or time.monotonic() + wait > deadline or stop.is_set():
                raise
            log.warning("the cluster is not reachable yet (%s); trying again in %.1fs", exc, wait)
            stop.wait(wait)


def _metrics_tls(args: argparse.Namespace) -> ServerTLS | None:
    """The metrics port's TLS (the chart's tls.metrics): the scheduler serves no gRPC, so only this port."""
    if args.tls_metrics_cert is None and args.tls_metrics_key is None:
        return None
    if args.tls_metrics_cert is None or args.tls_metrics_key is None:
        raise InvalidArgument("--tls-metrics-cert and --tls-metrics-key go together")
    return ServerTLS(args.tls_metrics_cert, args.tls_metrics_key)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    raise_open_files_limit()  # as every Sluice process does: its bucket files and connections
    # A thread waiting for the GIL gets it after at most this long when another thread computes: the
    # delivery path hands a due batch across three threads (delivery loop, producer sender, connection
    # reader) while the reader thread decodes coming buckets, and with the default 5 ms each hand-off could
    # wait 5 ms. 1 ms: the median stall of a delivery-like thread during a bucket read-in went from 2-5 ms
    # to 1.2 ms (bench/delayed_load_stall.py, docs/delayed-delivery.md).
    # Only in a process of its own: under `sluice up`'s combined mode the interval would be every service's.
    args = parse_args(argv)
    stop = threading.Event()
    host = current_host()
    if host is None:
        sys.setswitchinterval(0.001)
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
    else:  # one of several services in this process (`sluice up`'s combined mode): its launcher stops it
        host.on_stop(stop.set)
    try:
        client = Client(args.coordinator)
        _until_reachable(lambda: ensure_topic(client, args), stop)
        settings = SchedulerSettings(
            bucket_ms=args.bucket, preload_ms=args.preload, crash_after=args.crash_after_deliveries
        )
        scheduler = Scheduler(client, args.data_dir, settings, offset_clock(args.clock_offset_file))
        scheduler.start()
    except (SluiceError, OSError) as exc:  # an unreachable cluster, an unwritable data directory
        print(f"error: {exc}", file=sys.stderr)
        return 1
    httpd = None
    metrics = "-"
    if args.metrics_port is not None:
        try:
            httpd = start_http(args.metrics_host, args.metrics_port, scheduler.alive, _metrics_tls(args))
        except (SluiceError, OSError) as exc:
            print(f"error: metrics port: {exc}", file=sys.stderr)
            scheduler.stop()
            return 1
        metrics = f"{args.metrics_host}:{httpd.server_address[1]}"
        set_build_info("scheduler")
    say(f"SLUICE_READY service=scheduler address={args.coordinator} metrics={metrics}")
    while not stop.wait(10):
        log.info("delivered %d, in memory %d", scheduler.delivered, scheduler.pending_in_memory())
    scheduler.stop()
    if httpd is not None:
        httpd.shutdown()
        httpd.server_close()
    client.close()
    return 0
