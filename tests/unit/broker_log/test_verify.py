"""``verify_partition`` (``sluice broker verify``) on logs the broker wrote itself: random appends across
leader epochs, rolls, follower truncations, retention, flushes and reopens must all verify clean; so
verify has no false alarm on healthy logs, and the broker leaves no inconsistent index behind (it found
one: a time-index entry kept for a batch a truncation had removed, below)."""

from __future__ import annotations

import random
from pathlib import Path

from sluice.broker.log import LogConfig, PartitionLog
from sluice.broker.log.verify import verify_partition
from tests.unit.broker_log.helpers import make_batch, small_config


def _check(directory: Path) -> None:
    report = verify_partition(directory)
    assert report.ok, (report.errors, report.index_errors)


def test_a_truncation_that_empties_a_sealed_segment_drops_its_time_entry(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "t-0", small_config(segment_bytes=100))  # a segment per batch
    for seed, ts in enumerate((1000, 2000, 3000)):
        log.append(make_batch(3, ts=ts, seed=seed))
    assert log.segment_base_offsets() == [0, 3, 6]
    log.truncate_to(3)  # the sealed segment 3 becomes active and empty
    log.append(make_batch(3, ts=9000, seed=3))
    assert log.offset_for_timestamp(5000) == (3, 9000)
    log.close()
    _check(tmp_path / "t-0")  # failed before: the segment's time index kept (2002, 0) for a gone batch


def test_logs_built_by_random_operations_verify_clean(tmp_path: Path) -> None:
    rnd = random.Random(16)
    for trial in range(25):
        directory = tmp_path / f"t-{trial}"
        config = LogConfig(
            segment_bytes=rnd.choice([500, 2000, 8000]),
            index_interval_bytes=rnd.choice([1, 64, 512]),
            retention_bytes=rnd.choice([-1, 3000]),
            retention_ms=-1,
        )
        log = PartitionLog(directory, config)
        epoch = 0
        for i in range(rnd.randint(5, 60)):
            r = rnd.random()
            epoch += r < 0.05
            if r < 0.03 and log.log_end_offset > 5:
                log.truncate_to(rnd.randint(log.log_start_offset, log.log_end_offset))
                continue
            log.append(make_batch(rnd.randint(1, 20), ts=rnd.randint(0, 5000), seed=i), leader_epoch=epoch)
            if r > 0.95:
                log.apply_retention()
            if r > 0.9:
                log.flush()
        log.close()
        _check(directory)
        PartitionLog(directory, config).close()
        _check(directory)
