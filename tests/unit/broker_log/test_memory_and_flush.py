"""Memory stays flat as the log grows; flush() runs safely beside appends."""

from __future__ import annotations

import gc
import threading
import tracemalloc
from pathlib import Path

from sluice.broker.log import LogConfig, PartitionLog

from .helpers import make_batch, read_all

RECORDS_PER_BATCH = 200
BATCHES = 1000  # 200,000 records, ~9 MB on disk


def test_index_memory_is_a_few_bytes_per_index_interval(tmp_path: Path) -> None:
    template = make_batch(RECORDS_PER_BATCH, value_size=20)
    batch_bytes = len(template)
    assert batch_bytes > 4096  # so every batch earns an index entry: the worst case here
    cfg = LogConfig(segment_bytes=1 << 20, index_interval_bytes=4096, retention_ms=-1)
    log = PartitionLog(tmp_path, cfg)
    gc.collect()
    tracemalloc.start()
    try:
        baseline, _ = tracemalloc.get_traced_memory()
        for _ in range(BATCHES):
            log.append(template)
        gc.collect()
        retained, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert log.log_end_offset == RECORDS_PER_BATCH * BATCHES
    segments = len(log.segment_base_offsets())
    # One offset entry (8 B) and at most one time entry (12 B) per batch, plus array slack.
    assert log.index_memory_bytes() <= BATCHES * 20 * 1.25 + segments * 64
    # Nothing else grows per record or per batch: only per segment (a few hundred bytes).
    assert retained - baseline < 64 * 1024 + segments * 2048, (retained - baseline, segments)
    # Projection for the 10,000,000-record goal (~1.3 GB): one entry per 4 KiB of log.
    assert (1_300_000_000 // 4096) * 20 < 8 * 1024 * 1024


def test_flush_on_another_thread_while_appending_and_rolling(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=2000, index_interval_bytes=300, retention_ms=-1)
    log = PartitionLog(tmp_path, cfg)
    stop = threading.Event()
    errors: list[BaseException] = []
    flushes = 0

    def flusher() -> None:
        nonlocal flushes
        while not stop.is_set():
            try:
                log.flush()
                flushes += 1
            except BaseException as exc:
                errors.append(exc)
                return

    thread = threading.Thread(target=flusher)
    thread.start()
    try:
        for i in range(300):
            log.append(make_batch(3, seed=i))
            if i % 50 == 0:
                log.apply_retention()
    finally:
        stop.set()
        thread.join()
    assert not errors
    assert flushes > 0
    assert len(log.segment_base_offsets()) > 20
    log.close()
    reopened = PartitionLog(tmp_path, cfg)
    assert [r.offset for r in read_all(reopened)] == list(range(900))
