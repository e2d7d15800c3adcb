"""How long a bucket read-in holds up the scheduler's delivery thread (docs/delayed-delivery.md, "The due
path, third pass"), in process, no cluster.

A *ticker* thread stands in for the delivery loop: it sleeps 1 ms at a time, takes the timeline's lock
and pops what is due, as the loop does between batches, and records how late each wake-up was. Meanwhile
the reader's work for one coming bucket runs on another thread, as ``Scheduler._preload`` does it: read
and decode the bucket file (pausing as the scheduler does), build its in-memory state, install it under
the lock, with the cyclic GC off and frozen after. The ticker's worst and p99 wake-up lateness during the
read-in is the stall a due record sees; the same run without a read-in gives the machine's own noise.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import tempfile
import threading
import time
from pathlib import Path

from _stack import save
from sluice.broker.schedule.buckets import BucketStore
from sluice.broker.schedule.entry import Entry
from sluice.broker.schedule.scheduler import _yield_gil
from sluice.broker.schedule.timeline import Loaded, Timeline

NOW = 1_800_000_000_000
WIDTH = 10_000


def _entry(due: int, so: int) -> Entry:
    headers = {"sluice-deliver-at": b"%d" % due}
    return Entry(due, so % 8, so, "t", so % 4, b"k%d" % (so % 64), b"v" * 8, None, headers, NOW)


def read_in(store: BucketStore, timeline: Timeline, lock: threading.Lock, bucket: int) -> float:
    started = time.perf_counter()
    gc.disable()
    try:
        entries, done = store.load(bucket, _yield_gil)
        loaded = Loaded.of(entries, done)
        with lock:
            timeline.install(bucket, loaded)
    finally:
        gc.freeze()
        gc.enable()
    return time.perf_counter() - started


def run(records: int, with_read_in: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="sluice-stall-") as d:
        store = BucketStore(Path(d), WIDTH)
        rng = random.Random(1)
        # The bucket being delivered (in memory) and the next one (on disk, due in random order).
        store.append(_entry(NOW + i * WIDTH // records, i) for i in range(records))
        store.append(_entry(NOW + WIDTH + rng.randrange(WIDTH), records + i) for i in range(records))
        store.sync()
        timeline = Timeline(store, 0)
        timeline.advance(NOW)
        lock = threading.Lock()
        stop = threading.Event()
        lateness: list[float] = []

        def tick() -> None:
            due = NOW
            while not stop.is_set():
                before = time.perf_counter()
                time.sleep(0.001)
                with lock:
                    due += 10
                    timeline.pop_due(due, 2_000)
                lateness.append(time.perf_counter() - before - 0.001)

        ticker = threading.Thread(target=tick)
        ticker.start()
        time.sleep(0.2)
        lateness.clear()
        took = read_in(store, timeline, lock, store.bucket_of(NOW + WIDTH)) if with_read_in else 0.5
        if not with_read_in:
            time.sleep(took)
        stop.set()
        ticker.join()
    s = sorted(lateness)
    return {
        "read_in_seconds": round(took, 3) if with_read_in else 0.0,
        "ticks": len(s),
        "p50_ms": round(s[len(s) // 2] * 1000, 2),
        "p99_ms": round(s[int(len(s) * 0.99)] * 1000, 2),
        "max_ms": round(s[-1] * 1000, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=100_000, help="records per bucket")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    results = []
    for _ in range(args.runs):
        for with_read_in in (False, True):
            r = {"read_in": with_read_in, **run(args.records, with_read_in), "load": os.getloadavg()[0]}
            print(json.dumps(r), flush=True)
            results.append(r)
    save("delayed_load_stall", {"records": args.records, "results": results})


if __name__ == "__main__":
    main()
