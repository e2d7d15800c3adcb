"""The producer and consumer processes of one run, and the sampler of the servers' memory and CPU.

Both clients run in processes of their own (spawned: a fresh interpreter, as a user's would be) at
the same time; the consumer connects first and the producer starts once it is subscribed.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from compare.adapters.base import Adapter, Endpoint
from compare.workload import Feed, Sink, percentile

QUANTILES = {"p50": 0.5, "p99": 0.99, "p999": 0.999}


def _cpu() -> float:
    return time.process_time()  # user + system, every thread (the clock Feed and Sink read too)


def _call(fn: Callable[..., Any], *args: Any) -> None:
    result = fn(*args)
    if inspect.isawaitable(result):
        asyncio.run(_wait(result))


async def _wait(awaitable: Any) -> None:
    await awaitable


def quantiles_ms(values: list[float]) -> dict[str, float]:
    return {name: round(percentile(values, q) * 1000, 3) for name, q in QUANTILES.items()}


def producer_main(
    adapter: Adapter, endpoint: Endpoint, dest: str, n: int, rate: float, max_seconds: float,
    warmup_s: float, ready: Any, done: Any, sent: Any, out: Any,
) -> None:  # fmt: skip
    """The producer process: waits for the consumer, sends ``n`` records, reports through ``out``."""
    feed = Feed(n, rate, max_seconds=max_seconds, warmup_seconds=warmup_s)
    result: dict[str, Any] = {"side": "producer"}
    try:
        if not ready.wait(120):
            raise TimeoutError("the consumer did not subscribe within 120 s")
        cpu = _cpu()
        _call(adapter.produce, endpoint, dest, feed)
        result |= {
            "sent": feed.next_index,
            "started": feed.started,
            "acked_at": time.monotonic(),
            # From the first record handed out (imports and connecting are not per-record work).
            "cpu_s": _cpu() - (feed.started_cpu or cpu),
            "ack_ms": quantiles_ms(feed.ack_latencies),
        }
    except Exception:
        result["error"] = traceback.format_exc(limit=5)
    finally:
        sent.value = feed.next_index
        done.set()
        out.put(result)


def consumer_main(
    adapter: Adapter, endpoint: Endpoint, dest: str, n: int, keep: bool,
    ready: Any, done: Any, sent: Any, out: Any,
) -> None:  # fmt: skip
    """The consumer process: reads until every record came (or none comes any more), reports them."""
    sink = Sink(n, done, sent_total=sent, ready=ready, keep_latency=keep)
    result: dict[str, Any] = {"side": "consumer"}
    try:
        cpu = _cpu()
        _call(adapter.consume, endpoint, dest, sink)
        result["cpu_s"] = _cpu() - (sink.first_cpu or cpu)  # from the first record, as the producer's
    except Exception:
        result["error"] = traceback.format_exc(limit=5)
    finally:
        ready.set()  # a consumer that failed before subscribing must not hold the producer forever
        result |= {
            "expected": sink.expected(),
            "received": sink.received,
            "distinct": sink.distinct,
            "duplicates": sink.duplicates,
            "unexpected": sink.unexpected,
            "missing": sink.missing(),
            "first_missing": sink.first_missing(),
            "first_at": sink.first_at,
            "complete_at": sink.complete_at or sink.last_at,
            "latency_ms": quantiles_ms(sink.latencies),
            # The CDF's points: at most 2,000 of the sorted latencies, evenly spaced.
            "latency_cdf_ms": _cdf(sink.latencies),
        }
        out.put(result)


def _cdf(values: list[float], points: int = 2000) -> list[float]:
    ordered = sorted(values)
    if len(ordered) <= points:
        return [round(v * 1000, 3) for v in ordered]
    step = (len(ordered) - 1) / (points - 1)
    return [round(ordered[round(i * step)] * 1000, 3) for i in range(points)]


def _proc_stat(pid: int) -> tuple[float, float]:
    """(RSS in MB, CPU seconds) of one process, (0, 0) once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return rss, (int(fields[11]) + int(fields[12])) / tick


class Sampler:
    """Samples the summed RSS of every process of a system's servers (every 100 ms, from /proc) and
    keeps the peak; ``cpu()`` is the servers' CPU seconds so far (processes that ended keep theirs)."""

    def __init__(self, pids: Callable[[], list[int]], interval: float = 0.1) -> None:
        self.pids = pids
        self.interval = interval
        self.peak_mb = 0.0
        self.peak_by_pid: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self.cpu_by_pid: dict[int, float] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def sample(self) -> None:
        total = 0.0
        with self._lock:
            for pid in self.pids():
                rss, cpu = _proc_stat(pid)
                if not rss:
                    continue
                total += rss
                self.peak_by_pid[pid] = max(self.peak_by_pid.get(pid, 0.0), rss)
                self.cpu_by_pid[pid] = max(self.cpu_by_pid.get(pid, 0.0), cpu)
                if pid not in self.names:
                    with contextlib.suppress(OSError):
                        self.names[pid] = _name(pid)
            self.peak_mb = max(self.peak_mb, total)

    def cpu(self) -> float:
        self.sample()
        with self._lock:
            return sum(self.cpu_by_pid.values())

    def reset_peak(self) -> None:
        with self._lock:
            self.peak_mb = 0.0
            self.peak_by_pid.clear()

    def by_process(self) -> dict[str, float]:
        """Peak RSS (MB) per process, named by command line."""
        with self._lock:
            return {
                f"{self.names.get(pid, '?')} [{pid}]": round(mb, 1) for pid, mb in self.peak_by_pid.items()
            }

    @contextlib.contextmanager
    def running(self) -> Iterator[Sampler]:
        thread = threading.Thread(target=self._loop, daemon=True, name="rss-sampler")
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()


def _name(pid: int) -> str:
    """A short name: ``broker`` for ``python -m sluice broker ...``, else the program's base name."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    words = [a.decode(errors="replace") for a in argv if a]
    if "sluice" in words and words.index("sluice") + 1 < len(words):
        return f"sluice {words[words.index('sluice') + 1]}"
    return os.path.basename(words[0]) if words else "?"
