"""Send futures: one shared BatchResult per batch, offsets base + index, callbacks, timeouts."""

from __future__ import annotations

import threading

import pytest

from sluice.client.producer.futures import BatchResult, FutureRecordMetadata, RecordMetadata
from sluice.errors import NotLeader, RequestTimedOut, SluiceError


def test_offsets_are_base_plus_index() -> None:
    r = BatchResult("t", 2)
    futs = [FutureRecordMetadata(r, i, 1000 + i) for i in range(3)]
    assert not any(f.done() for f in futs)
    r.complete(40, 5000, None)
    assert all(f.done() for f in futs)
    assert [f.result() for f in futs] == [RecordMetadata("t", 2, 40 + i, 1000 + i) for i in range(3)]
    assert futs[0].exception() is None
    assert not futs[0].cancelled()


def test_error_is_raised_by_every_future() -> None:
    r = BatchResult("t", 0)
    a, b = FutureRecordMetadata(r, 0, 1), FutureRecordMetadata(r, 1, 1)
    r.complete(-1, -1, NotLeader("moved"))
    for f in (a, b):
        with pytest.raises(NotLeader, match="moved"):
            f.result()
        assert isinstance(f.exception(), NotLeader)
    # Each raise is its own copy: tracebacks do not pile up on one shared object.
    with pytest.raises(NotLeader) as e1:
        a.result()
    with pytest.raises(NotLeader) as e2:
        a.result()
    assert e1.value is not e2.value


def test_timeout_raises_a_timeout_error() -> None:
    f = FutureRecordMetadata(BatchResult("t", 0), 0, 1)
    with pytest.raises(RequestTimedOut):
        f.result(timeout=0.01)
    with pytest.raises(TimeoutError):
        f.exception(timeout=0.01)
    assert issubclass(RequestTimedOut, SluiceError)


def test_complete_only_once() -> None:
    r = BatchResult("t", 0)
    r.complete(7, 1, None)
    r.complete(99, 1, NotLeader())
    assert FutureRecordMetadata(r, 1, 0).result().offset == 8


def test_callbacks_run_once_after_and_before_completion() -> None:
    r = BatchResult("t", 1)
    early = FutureRecordMetadata(r, 0, 1)
    calls: list[tuple[str, int]] = []
    early.add_done_callback(lambda f: calls.append(("early", f.result().offset)))
    assert calls == []
    r.complete(10, 1, None)
    assert calls == [("early", 10)]
    late = FutureRecordMetadata(r, 3, 1)
    late.add_done_callback(lambda f: calls.append(("late", f.result().offset)))
    assert calls == [("early", 10), ("late", 13)]


def test_a_failing_callback_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    r = BatchResult("t", 1)
    seen: list[int] = []

    def boom(f: FutureRecordMetadata) -> None:
        raise RuntimeError("user bug")

    FutureRecordMetadata(r, 0, 1).add_done_callback(boom)
    FutureRecordMetadata(r, 1, 1).add_done_callback(lambda f: seen.append(f.result().offset))
    r.complete(0, 1, None)
    assert seen == [1]
    assert "callback raised" in caplog.text


def test_result_wakes_a_waiting_thread() -> None:
    r = BatchResult("t", 0)
    f = FutureRecordMetadata(r, 0, 5)
    out: list[RecordMetadata] = []
    t = threading.Thread(target=lambda: out.append(f.result(timeout=5)))
    t.start()
    r.complete(1, 1, None)
    t.join(5)
    assert out == [RecordMetadata("t", 0, 1, 5)]


def test_acks0_without_offsets() -> None:
    r = BatchResult("t", 0)
    r.complete(-1, -1, None)
    assert FutureRecordMetadata(r, 4, 9).result().offset == -1
