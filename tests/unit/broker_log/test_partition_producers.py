"""The producer table kept in step with a log: runs checked whole, state recorded at the offsets written,
rebuilt from a snapshot plus the headers after it, and exactly after a truncation."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from sluice.broker.log import producer_snapshot
from sluice.broker.log.producers import PartitionProducers
from sluice.codec.batch import BatchBuilder, BatchHeader, read_header, stamp
from sluice.errors import OutOfOrderSequence


def _batch(pid: int, seq: int, records: int = 2, epoch: int = 0) -> bytearray:
    builder = BatchBuilder()
    for i in range(records):
        builder.append(b"v%d" % i, None, None, None, 1_000 + i)
    return bytearray(builder.build((pid, epoch, seq)))


class _Log:
    """Offsets and stamped headers, as a PartitionLog would hand them over."""

    def __init__(self, producers: PartitionProducers) -> None:
        self.producers = producers
        self.headers: list[BatchHeader] = []
        self.end = 0

    def produce(self, *batches: bytearray) -> tuple[int, int]:
        headers = [read_header(b) for b in batches]
        earlier = self.producers.check(headers)
        if earlier is not None:
            return earlier[0], earlier[1]
        first = self.end
        stamped = []
        for b, h in zip(batches, headers, strict=True):
            stamp(b, 0, self.end, 5_000, 0)
            stamped.append(read_header(b))
            self.end += h.record_count
        self.headers += stamped
        self.producers.record(stamped, first, 5_000)
        return first, self.end - 1

    def headers_from(self, offset: int) -> Iterable[BatchHeader]:
        return [h for h in self.headers if h.last_offset >= offset]

    def cut(self, offset: int) -> None:
        self.headers = [h for h in self.headers if h.last_offset < offset]
        self.end = offset


def test_a_retried_run_is_answered_with_its_first_offsets(tmp_path: Path) -> None:
    log = _Log(PartitionProducers(tmp_path))
    assert log.produce(_batch(1, 0), _batch(1, 2)) == (0, 3)
    assert log.produce(_batch(1, 0), _batch(1, 2)) == (0, 3)  # the same run again: nothing written
    assert log.end == 4
    assert log.produce(_batch(1, 4)) == (4, 5)


def test_a_run_part_duplicate_part_new_or_with_a_gap_inside_is_refused(tmp_path: Path) -> None:
    log = _Log(PartitionProducers(tmp_path))
    log.produce(_batch(1, 0))
    with pytest.raises(OutOfOrderSequence, match="written before and the rest were not"):
        log.produce(_batch(1, 0), _batch(1, 2))
    with pytest.raises(OutOfOrderSequence, match="in the same request"):
        log.produce(_batch(1, 2), _batch(1, 7))
    assert log.end == 2


def test_recovery_from_a_snapshot_and_the_headers_after_it_gives_the_same_table(tmp_path: Path) -> None:
    producers = PartitionProducers(tmp_path)
    log = _Log(producers)
    for seq in range(0, 10, 2):
        log.produce(_batch(1, seq))
        log.produce(_batch(2, seq))
    producers.snapshot(log.end)  # as at a roll
    for seq in range(10, 16, 2):
        log.produce(_batch(1, seq))
    expected = producers.table.entries()
    fresh = PartitionProducers(tmp_path)
    fresh.recover(0, log.end, log.headers_from)
    assert fresh.table.entries() == expected
    # A damaged snapshot: recovery replays the whole log and ends with the same table.
    path = producer_snapshot.path_for(tmp_path, 20)
    path.write_bytes(path.read_bytes()[:-1])
    again = PartitionProducers(tmp_path)
    again.recover(0, log.end, log.headers_from)
    assert again.table.entries() == expected


def test_after_a_truncation_the_cut_batches_are_forgotten_and_their_retry_is_written(tmp_path: Path) -> None:
    producers = PartitionProducers(tmp_path)
    log = _Log(producers)
    log.produce(_batch(1, 0))  # 0-1
    producers.snapshot(2)
    log.produce(_batch(1, 2))  # 2-3
    producers.snapshot(4)
    log.cut(2)
    producers.truncated(0, 2, log.headers_from)
    assert producer_snapshot.offsets(tmp_path) == [2]
    assert log.produce(_batch(1, 2)) == (2, 3)  # appended again, not answered as a duplicate
    assert log.produce(_batch(1, 0)) == (0, 1)  # still known as written
