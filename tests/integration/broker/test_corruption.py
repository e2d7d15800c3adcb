"""A real broker process, killed with -9, restarted on a data directory with a flipped bit in a sealed
segment: the damaged batch is found by the unclean-shutdown verification, nothing around it is lost,
and it is never served (docs/replication.md, "Recovery")."""

from __future__ import annotations

from pathlib import Path

from sluice.codec.batch import decode_records, iter_headers
from sluice.v1 import common_pb2

from .conftest import Broker, make_batch, running_broker, start_broker, vals

TOPIC = "rot"


def _fetch_all_from(broker: Broker, offset: int, end: int) -> tuple[list[int], int]:
    """Offsets fetched from ``offset`` until an error or ``end``; and the error code met (NONE if none)."""
    got: list[int] = []
    for _ in range(1000):
        if offset >= end:
            return got, common_pb2.NONE
        resp = broker.fetch_one(TOPIC, offset, max_bytes=1 << 16)
        if resp.error.code != common_pb2.NONE:
            return got, resp.error.code
        got += [r.offset for r in decode_records(resp.records, TOPIC, 0, offset)]
        offset = resp.next_offset
    raise AssertionError("no progress")


def test_a_flipped_bit_after_kill_9_is_found_fenced_off_and_stays_found(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    broker = start_broker(data_dir, flush="always")
    broker.assign(TOPIC, segment_bytes=4096)
    for i in range(60):
        assert broker.produce(TOPIC, 0, make_batch(vals(5, f"b{i}-"))).error.code == common_pb2.NONE
    broker.kill()
    broker.close()
    segments = sorted((data_dir / f"{TOPIC}-0").glob("*.log"))
    assert len(segments) >= 3
    raw = bytearray(segments[1].read_bytes())
    batches = list(iter_headers(bytes(raw)))
    pos, header = batches[len(batches) // 2]
    raw[pos + header.length - 2] ^= 0x20  # a record's value, in the middle of a sealed segment
    segments[1].write_bytes(bytes(raw))
    bad = (header.base_offset, header.next_offset)

    for restart in ("after kill -9", "after a clean stop with the damage still there"):
        with running_broker(data_dir, flush="always") as again:
            end = again.offsets(TOPIC, -1).offset
            assert end == 300, restart  # nothing after the damaged batch was dropped
            before, code = _fetch_all_from(again, 0, end)
            assert before == list(range(bad[0])), restart  # everything up to it, then ...
            assert code == common_pb2.STORAGE_ERROR, restart  # ... a retriable error, never bad bytes
            after, code = _fetch_all_from(again, bad[1], end)
            assert after == list(range(bad[1], end)), restart
            assert code == common_pb2.NONE
