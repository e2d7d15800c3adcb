"""Idempotent produce against a real broker process: a retried batch is written once and answered with
its first offsets, gaps and fenced epochs are refused typed, and the state survives kill -9 and a clean
restart (rebuilt from batch headers, or read from the snapshot)."""

from __future__ import annotations

from pathlib import Path

from sluice.broker.log import producer_snapshot
from sluice.codec.batch import BatchBuilder
from sluice.v1 import common_pb2

from .conftest import records, running_broker, start_broker


def _batch(pid: int, seq: int, n: int = 3, epoch: int = 0, tag: str = "") -> bytes:
    b = BatchBuilder()
    for i in range(n):
        b.append(f"{tag}p{pid}-s{seq + i}".encode(), None, None, None, 1_000 + i)
    return b.build((pid, epoch, seq))


def test_retries_are_written_once_and_refusals_are_typed(tmp_path: Path) -> None:
    with running_broker(tmp_path / "data") as broker:
        broker.assign("idem")
        first = broker.produce("idem", 0, _batch(7, 0))
        assert (first.error.code, first.base_offset) == (common_pb2.NONE, 0)
        broker.produce("idem", 0, _batch(99, 0))  # another producer in between: offsets 3-5
        again = broker.produce("idem", 0, _batch(7, 0))  # the answer was lost; the SDK retries
        assert (again.error.code, again.base_offset) == (common_pb2.NONE, 0)
        assert broker.produce("idem", 0, _batch(7, 3)).base_offset == 6
        gap = broker.produce("idem", 0, _batch(7, 10))
        assert gap.error.code == common_pb2.OUT_OF_ORDER_SEQUENCE
        assert broker.produce("idem", 0, _batch(7, 0, epoch=1)).base_offset == 9  # a new epoch fences 0
        fenced = broker.produce("idem", 0, _batch(7, 6, epoch=0))
        assert fenced.error.code == common_pb2.INVALID_PRODUCER_EPOCH
        unknown = broker.produce("idem", 0, _batch(8, 5))
        assert unknown.error.code == common_pb2.UNKNOWN_PRODUCER_ID
        assert broker.metric("sluice_broker_producer_ids") == 2  # producers 7 and 99
        plain = broker.fetch_one("idem", 0)
        assert [r.offset for r in records(plain)] == list(range(12))  # each batch once, nothing else


def test_the_state_survives_kill_9_and_a_clean_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = start_broker(data, flush="always")
    broker.assign("idem")
    for seq in range(0, 30, 3):
        assert broker.produce("idem", 0, _batch(7, seq)).error.code == common_pb2.NONE
    broker.kill()  # no snapshot written: the state comes back from the batch headers
    broker.close()
    with running_broker(data, flush="always") as broker:
        retry = broker.produce("idem", 0, _batch(7, 27))
        assert (retry.error.code, retry.base_offset) == (common_pb2.NONE, 27)
        assert broker.produce("idem", 0, _batch(7, 30)).base_offset == 30
    # The clean stop wrote a snapshot at the log end; the next open reads it instead of replaying.
    assert producer_snapshot.offsets(data / "idem-0") == [33]
    with running_broker(data, flush="always") as broker:
        retry = broker.produce("idem", 0, _batch(7, 30))
        assert (retry.error.code, retry.base_offset) == (common_pb2.NONE, 30)
        assert broker.fetch_one("idem", 0).high_watermark == 33
