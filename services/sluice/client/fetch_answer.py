"""What one Fetch answer does to the partitions it names: positions move on, records are collected.

Kept apart from the fetcher's loop (``fetcher.py``) because it is the one place where an answer meets
the partitions' state, and the rules are subtle: a partition removed, paused or seeked while the
request travelled ignores its part of the answer; a followed fetch's sent offsets move on with each
answer, because the broker reads on from there by itself.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sluice.client.fetch_errors import PartitionErrors
from sluice.client.fetch_session import PartitionFetchState, SessionRequest
from sluice.client.fetch_state import BrokerState, PartitionState, RawChunk, TopicPartition, end_of
from sluice.client.stages import stage
from sluice.client.throttles import throttled_answer
from sluice.client.wire_lanes import FetchLane
from sluice.errors import error_from_proto
from sluice.v1 import broker_pb2

__all__ = ["Answers", "Completion", "advance", "drive", "nudge", "throttled_answer", "undrive"]

#: What the connections' threads hand the fetching thread: (broker address, the request
#: answered, its answer or a SluiceError, whether the request is followed).
Completion = tuple[str, SessionRequest, Any, bool]

_HANDOFF = stage("fetch_handoff")


class Answers:
    """The answers the connections' threads hand the fetching thread, in arrival order.

    ``hold`` puts one back at the front: ``fetch()`` takes one followed answer with records per
    call and leaves the next for the next call (fetcher.py, ``fetch_raw``). ``on_arrival`` is called
    from the connection's thread after each answer is queued (the group consumer's fetch driver
    wakes on it); it must not block.
    """

    def __init__(self) -> None:
        #: (when it arrived, perf_counter; the answer): the hand-off is a stage (client/stages.py).
        self._queue: queue.SimpleQueue[tuple[float, Completion]] = queue.SimpleQueue()
        self._held: Completion | None = None
        self.on_arrival: Callable[[], None] | None = None
        #: The lane whose connection the fetching thread reads while it waits (``drive``), for ``nudge``.
        self.driving: FetchLane | None = None

    def put(self, item: Completion) -> None:
        self._queue.put((time.perf_counter(), item))
        notify = self.on_arrival
        if notify is not None:
            notify()

    def hold(self, item: Completion) -> None:
        self._held = item

    def take(self, timeout: float | None) -> Completion | None:
        """The held answer, or the next to arrive within ``timeout`` (None: none came)."""
        item, self._held = self._held, None
        if item is not None:
            return item
        try:
            return _taken(self._queue.get(timeout=timeout))
        except queue.Empty:
            return None

    def waiting(self) -> int:
        """Answers arrived and not yet taken: queued, or held."""
        return self._queue.qsize() + (self._held is not None)

    def take_nowait(self) -> Completion | None:
        return self.take(0) if self._held is not None else _get_nowait(self._queue)


def _get_nowait(q: queue.SimpleQueue[tuple[float, Completion]]) -> Completion | None:
    try:
        return _taken(q.get_nowait())
    except queue.Empty:
        return None


def _taken(entry: tuple[float, Completion]) -> Completion:
    _HANDOFF.observe(time.perf_counter() - entry[0])
    return entry[1]


def drive(
    answers: Answers,
    brokers: Iterable[BrokerState],
    timeout: float | None,
    stop: Callable[[], bool] | None = None,
) -> bool:
    """Wait for the next answer by reading its connection on this thread (True) when all that is
    in flight is one followed lane: no hand-off from the connection's reader thread, whose wake-up
    and GIL hand-over were a p99 stage at 2,000 records/s (docs/latency.md, "Third pass"). The
    lanes of a fetch spread over several brokers are read by their connections' threads.

    ``stop`` (the group consumer's ``poll()``, "Fourth pass"): the wait also ends when it returns
    True (another thread calls ``nudge`` after setting it), and the lane drives only if its owner
    would read the connection alone (``SharedConnection.drive``'s ``alone``); else False, no wait.
    With answers already waiting it still marks the lane driven (True, no wait): a consumer that finds
    its answers read by the reader thread (it polls behind them) would otherwise never take over."""
    if stop is None and answers.waiting():
        return False
    flying = [b for b in brokers if b.in_flight is not None]
    lane = flying[0].stream if len(flying) == 1 and flying[0].follow is not None else None
    if isinstance(lane, FetchLane):
        ready = answers.waiting if stop is None else lambda: answers.waiting() or stop()
        answers.driving = lane
        try:
            return lane.drive(ready, timeout, alone=stop is not None)
        finally:
            answers.driving = None
    undrive(flying)
    return False


def nudge(answers: Answers) -> None:
    """End the fetching thread's wait in ``drive`` (any thread; its ``stop()`` is already True)."""
    lane = answers.driving
    if lane is not None:
        lane.nudge()


def undrive(brokers: Iterable[BrokerState]) -> None:
    """The fetcher does not wait on these lanes' connections: their reader threads read for it."""
    for b in brokers:
        if isinstance(b.stream, FetchLane):
            b.stream.undrive()


def advance(
    parts: Mapping[TopicPartition, PartitionState],
    errors: PartitionErrors,
    req: SessionRequest,
    following: dict[TopicPartition, PartitionFetchState] | None,
    resp: broker_pb2.FetchResponse,
    chunks: list[RawChunk],
) -> tuple[bool, bool]:
    """Moves each answered partition's position on and appends its records to ``chunks``.

    Returns (ended, lost_leader): ended when a partition came back with an error (a followed
    fetch stops there); lost_leader when a partition's error means the metadata is stale.
    """
    ended = lost_leader = False
    for pr in resp.partitions:
        tp = (pr.topic, pr.partition)
        if following is None:
            sent = req.session.get(tp)
        else:
            sent = following.get(tp)
            if sent is not None:  # the broker reads on from here (it stops after an error)
                following[tp] = sent._replace(fetch_offset=pr.next_offset)
        err = error_from_proto(pr.error)
        ended = ended or err is not None
        st = parts.get(tp)
        if sent is None or st is None or st.position != sent.fetch_offset or st.paused:
            continue  # removed or seeked while the request was in flight
        if err is not None:
            lost_leader = errors.handle(tp, st, pr, err) or lost_leader
            continue
        st.failures = 0
        st.high_watermark = pr.high_watermark  # once per partition per answer, never per record
        data = pr.records
        nxt = pr.next_offset
        if nxt <= sent.fetch_offset and data:
            nxt = end_of(data, sent.fetch_offset)
        st.position = max(st.position, nxt)
        if data:
            st.fetched_epoch = sent.leader_epoch
            chunks.append(RawChunk(pr.topic, pr.partition, sent.fetch_offset, data, sent.leader_epoch))
    return ended, lost_leader
