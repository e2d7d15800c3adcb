"""Property test: the log behaves like a list of stamped batches, whatever the segment
layout, index spacing, read limits, restarts and crashes."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.broker.log import LogConfig, PartitionLog
from sluice.codec.batch import read_header, stamp
from sluice.errors import OffsetOutOfRange
from tests.examples import examples

from .helpers import Clock, abandon, make_batch


@dataclass
class Model:
    """The expected log: stamped batches in order."""

    batches: list[tuple[int, int, bytes]] = field(default_factory=list)  # (base, next, bytes)

    @property
    def end(self) -> int:
        return self.batches[-1][1] if self.batches else 0

    def read(self, offset: int, max_bytes: int, min_one: bool) -> tuple[bytes, int]:
        i = next(i for i, (_, nxt, _) in enumerate(self.batches) if nxt > offset)
        out: list[bytes] = []
        size, next_offset = 0, offset
        for _, nxt, raw in self.batches[i:]:
            if size + len(raw) > max_bytes and not (min_one and not out):
                break
            out.append(raw)
            size += len(raw)
            next_offset = nxt
        return b"".join(out), next_offset


append_op = st.tuples(
    st.just("append"),
    st.lists(st.tuples(st.integers(1, 12), st.integers(0, 60)), min_size=1, max_size=4),
)
read_op = st.tuples(st.just("read"), st.floats(0, 1), st.integers(0, 3000), st.booleans())
ops = st.lists(
    st.one_of(
        append_op, append_op, read_op, read_op, st.tuples(st.sampled_from(["reopen", "crash", "tick"]))
    ),
    max_size=40,
)


@settings(max_examples=examples(60), deadline=None)
@given(
    ops,
    st.integers(200, 3000),  # segment_bytes
    st.integers(1, 800),  # index_interval_bytes
)
def test_log_matches_the_model(operations: list[tuple[Any, ...]], segment_bytes: int, interval: int) -> None:
    cfg = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=interval, retention_ms=-1)
    clock = Clock()
    model = Model()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        log = PartitionLog(path, cfg, clock)
        seed = 0
        for op in operations:
            kind = op[0]
            if kind == "append":
                raws = []
                for count, value_size in op[1]:
                    seed += 1
                    raws.append(make_batch(count, ts=clock.now, value_size=value_size, seed=seed))
                result = log.append(b"".join(raws))
                assert result.base_offset == model.end
                for raw in raws:
                    stamped = bytearray(raw)
                    base = model.end
                    stamp(stamped, 0, base, clock.now, 0)
                    model.batches.append((base, base + read_header(raw).record_count, bytes(stamped)))
                assert result.last_offset == model.end - 1
            elif kind == "read":
                fraction, max_bytes, min_one = op[1], op[2], op[3]
                offset = int(fraction * model.end)
                res = log.read(offset, max_bytes, min_one)
                if offset == model.end:
                    assert (res.data, res.next_offset) == (b"", offset)
                    continue
                data, next_offset = model.read(offset, max_bytes, min_one)
                assert res.data == data
                assert res.next_offset == next_offset
            elif kind == "reopen":
                log.close()
                log = PartitionLog(path, cfg, clock)
            elif kind == "crash":
                abandon(log)
                log = PartitionLog(path, cfg, clock)
            else:
                clock.advance(1000)
            assert log.log_end_offset == model.end
        try:
            log.read(model.end + 1, 10)
        except OffsetOutOfRange:
            pass
        else:
            raise AssertionError("reading past the end must fail")
        log.close()
