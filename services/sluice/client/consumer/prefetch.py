"""Background prefetch: keeps fetching the assigned partitions into a bounded buffer.

The prefetcher owns a :class:`~sluice.client.fetcher.Fetcher` (which keeps at most one
Fetch in flight per broker, with incremental sessions, and pipelines the next
request before decoding). It has no thread of its own: the Client's
:class:`~sluice.client.consumer.fetch_driver.FetchDriver` runs its *steps*, one whenever
an answer arrives (the fetcher's ``on_completion``), ``poll()`` frees buffer space or a
command comes, and none waits for the network. Each step's encoded batches
(``poll_raw``: one run per partition and response) are decoded into one :class:`Chunk`
per run and appended to a buffer that ``poll()`` drains (Kafka's completed-fetch buffer). A partition whose
position moved without records (a tag filter skipped everything, or
auto_offset_reset moved it) yields an empty chunk, so the consumer learns the new
position and can commit it.

Flow control: while the buffer holds ``buffer_max_bytes`` (value bytes plus a fixed
per-record overhead), the prefetcher stops fetching every partition. The round that
crossed the bound still lands whole: per broker, the answer in hand and, if it
arrived meanwhile, the pipelined next one (each at most ``partition_max_bytes`` per
partition, or one batch). Fetching resumes as soon as ``poll()`` drains below the
bound.

**poll() drives** (docs/latency.md, "Fourth pass"): a sync ``poll()`` that finds the buffer empty
*claims* the prefetcher and runs its steps on its own thread while it waits (``claim``, ``drive``):
when the one request in flight is a followed lane on a connection it would read alone, it waits by
reading that socket itself (``Fetcher.wait_answer``), so an answer reaches ``poll()`` with no
other thread woken (the reader thread rests; before, it woke the driver, which woke ``poll()``).
Meanwhile the driver skips the prefetcher's steps, and a wake-up from another thread ends the
wait. Otherwise (several brokers, other consumers' lanes on the connection, ``sluice.aio``, a
backoff) it is the driver's, as above.

Changes to what is fetched (assign, seek, remove) are commands that the next step
applies. Every chunk is tagged with its partition's *fetch epoch*
as of the round; the consumer bumps a partition's epoch on seek, pause and
revoke, and drops chunks from older epochs, so nothing fetched from an old
position is ever handed out.

Caller: the Consumer (commands, ``pop``, ``claim``/``drive`` from ``poll()``); the fetch driver (``step``).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

from sluice.client.consumer.fetch_driver import FetchDriver
from sluice.client.fetch_state import decoding
from sluice.client.fetcher import Fetcher, RawChunk
from sluice.client.memory import ClientMemory
from sluice.client.wakers import WakeableCondition
from sluice.codec.batch import Record, RecordColumns, decode_columns, decode_records
from sluice.errors import SluiceError

__all__ = ["Chunk", "Prefetcher", "cut_chunks", "decode_runs"]

log = logging.getLogger("sluice.consumer.prefetch")

TopicPartition = tuple[str, int]
#: Counted per buffered record on top of its value bytes (object headers, key, offsets).
RECORD_OVERHEAD = 64
_VALUE = attrgetter("value")


@dataclass(slots=True)
class Chunk:
    """Records of one partition from one fetch round, in offset order."""

    tp: TopicPartition
    fetch_epoch: int
    records: list[Record]
    #: The fetch position after this chunk (past records a filter skipped, too).
    next_offset: int
    nbytes: int
    #: Records before this index were handed out already.
    start: int = 0
    #: How many records the current poll took from it (for the pro-rata byte count).
    taken_now: int = 0
    #: The leader epoch its records were fetched in (KIP-320; -1: unknown): commits carry it.
    leader_epoch: int = -1
    #: The records as columns instead (decoded for ``poll_columns``; ``records`` is then empty).
    cols: RecordColumns | None = None

    def size(self) -> int:
        return len(self.cols) if self.cols is not None else len(self.records)

    def as_records(self) -> list[Record]:
        """The records as objects, converted once if they were decoded as columns (``poll()`` after
        ``poll_columns()``)."""
        if self.cols is not None:
            self.records, self.cols = self.cols.records(), None
        return self.records

    def as_columns(self) -> RecordColumns:
        """The records as columns, converted once if they were decoded as objects."""
        if self.cols is None:
            self.cols = RecordColumns.of_records(self.tp[0], self.tp[1], self.records)
            self.records = []
        return self.cols


@dataclass(frozen=True, slots=True)
class _Command:
    tp: TopicPartition
    #: None: stop fetching ``tp``.
    offset: int | None
    fetch_epoch: int = 0
    filter: str = "*"
    #: The leader epoch committed with ``offset`` (-1: none): the fetcher checks it after a leader change.
    leader_epoch: int = -1


class Prefetcher:
    """Fetches, in steps run by the Client's fetch driver, into a byte-bounded buffer.

    ``lock`` is the Consumer's lock; ``ready`` (a Condition on it) is notified when a
    chunk or an error arrives.
    """

    def __init__(
        self,
        fetcher: Fetcher,
        buffer_max_bytes: int,
        lock: threading.RLock,
        ready: WakeableCondition,
        driver: FetchDriver,
        check_crcs: bool = True,
        memory: ClientMemory | None = None,
    ) -> None:
        self._fetcher = fetcher
        #: The Client's memory_limit, shared by all its consumers (``client/memory.py``).
        self._memory = memory if memory is not None else ClientMemory()
        self._check_crcs = check_crcs
        self._max_bytes = buffer_max_bytes
        self._lock = lock
        self._ready = ready
        self._driver = driver
        #: A step is queued on the driver (see ``Steppable``).
        self.queued = False
        #: Who runs the steps: the driver (``_stepping`` while it does), or poll()'s thread that
        #: claimed them (its id), woken (``_woken``) by other threads. ``_guard`` orders the two.
        self._guard = threading.Lock()
        self._stepping = False
        self._claimant: int | None = None
        self._woken = False
        #: Steps poll()'s thread ran, and their count when the driver was last asked for one: a driver's
        #: step asked for before a claimant's step is covered by it (and would hand the lane back).
        self._claimed_steps = 0
        self._asked_at = 0
        #: poll()'s thread took the lanes over (it waited in the socket once): they stay driven (their
        #: answers wait in the socket while poll() is away, the connection's thread rests), so a poll()
        #: at its deadline reads them (``drive(0)``), and the driver's steps leave them driven (handing
        #: them back at every answer the thread read in a race would flip them back and forth). Only a
        #: wait that cannot drive (``Fetcher.wait_answer`` False) hands them back to the threads.
        self.in_socket = False
        self._commands: list[_Command] = []
        self._buffer: deque[Chunk] = deque()
        self._bytes = 0
        self._errors: list[SluiceError] = []
        self._closed = False
        #: Decode fetched records as columns (the consumer's last poll was a ``poll_columns``).
        self.columnar = False
        # The steps' state (only the driver's thread touches it).
        self._epochs: dict[TopicPartition, int] = {}
        self._filters: dict[str, str] = {}
        fetcher.on_completion = self.wake

    def wake(self) -> None:
        """Ask for a step (any thread, never blocks): the driver's, or, while poll()'s thread runs them
        (``claim``), end its wait so it steps (its own wake-ups it sees by itself)."""
        me = threading.get_ident()
        with self._guard:
            claimant = self._claimant
            if claimant is None:
                self._asked_at = self._claimed_steps
            elif claimant != me:
                self._woken = True
        if claimant is None:
            self._driver.wake(self)
        elif claimant != me:
            self._fetcher.nudge()

    # ---- commands (Caller: the Consumer, holding the lock) -------------------------------------

    def fetch_from(
        self, tp: TopicPartition, offset: int, fetch_epoch: int, filter_expr: str, leader_epoch: int = -1
    ) -> None:
        """Fetch ``tp`` from ``offset`` on (adds it, or moves it); tag its chunks ``fetch_epoch``.
        ``leader_epoch``: the one committed with ``offset``, if it is a committed one (KIP-320)."""
        self._commands.append(_Command(tp, offset, fetch_epoch, filter_expr, leader_epoch))
        self.wake()

    def stop_fetching(self, tp: TopicPartition) -> None:
        self._commands.append(_Command(tp, None))
        self.wake()

    def highwater(self, tp: TopicPartition) -> int | None:
        return self._fetcher.highwater(tp)

    # ---- the buffer (Caller: the Consumer's poll, holding the lock) ------------------------------

    def pop(self) -> Chunk | None:
        if not self._buffer:
            return None
        chunk = self._buffer.popleft()
        self._release(chunk.nbytes)
        return chunk

    def push_front(self, chunk: Chunk) -> None:
        """Put back the rest of a chunk that one poll could not take whole."""
        # Pro rata, not re-summed: a chunk taken 500 records at a time would cost O(n^2).
        left = chunk.size() - chunk.start
        chunk.nbytes = chunk.nbytes * left // max(left + chunk.taken_now, 1)
        chunk.taken_now = 0
        self._buffer.appendleft(chunk)
        self._bytes += chunk.nbytes
        self._memory.add(chunk.nbytes)

    def take_error(self) -> SluiceError | None:
        return self._errors.pop(0) if self._errors else None

    @property
    def buffered_bytes(self) -> int:
        return self._bytes

    def _release(self, nbytes: int) -> None:
        was_full = self._bytes >= self._max_bytes
        self._bytes -= nbytes
        self._memory.release(nbytes)  # wakes the Client's consumers that its limit stopped
        if was_full and self._bytes < self._max_bytes:
            self.wake()

    # ---- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Nothing to start (the driver steps it when there is work); kept for the Consumer's order."""

    def close(self, timeout: float = 5.0) -> None:
        """Stop: no step fetches or buffers anything more. A step running meanwhile on the
        driver ends at its next check (``timeout``: unused, kept for the Consumer's calls)."""
        with self._lock:
            self._closed = True
            held, self._bytes = self._bytes, 0
            self._buffer.clear()
        self._memory.forget(self)
        self._memory.release(held)
        self._fetcher.close()

    # ---- poll()'s thread running the steps (docs/latency.md, "Fourth pass") -----------------------

    def claim(self) -> bool:
        """Caller: poll(), holding the lock, having found nothing to take. True: this thread runs the
        steps until ``drive`` returns (the driver skips them), and a notification of ``ready`` from
        another thread ends its wait. False: the driver is running a step, or the prefetcher closed."""
        with self._guard:
            if self._stepping or self._claimant is not None or self._closed:
                return False
            self._claimant = threading.get_ident()
        self._ready.add_waker(self._nudge)
        return True

    def drive(self, timeout: float) -> bool:
        """Caller: poll()'s thread after ``claim``, without the lock. A step; if it brought nothing and
        the one request in flight is a followed lane this thread may read alone, wait up to ``timeout``
        for the answer reading the connection here (``Fetcher.wait_answer``), then another step. True:
        poll() looks again now. False: nothing could be waited for here (several brokers, other lanes
        on the connection, a backoff, nothing to fetch): poll() waits on ``ready``, the driver steps."""
        again: float | None = None
        try:
            # Straight to the socket when nothing changed since the last step (the steady state: one
            # step per answer, after it); else a step first (a command, answers that came, a new fetch).
            if not self._commands and self._may_fetch() and self._wait(timeout):
                again = self._claimed_step()[1]
                return True
            fetching, again = self._claimed_step()
            if not fetching or again is not None or self._buffer:
                return again == 0.0 or bool(self._buffer)  # records, or an error to raise
            if not self._wait(timeout):
                return self._fetcher.arrived() > 0  # came meanwhile: the next claim's step takes it
            again = self._claimed_step()[1]
            return True
        finally:
            with self._lock:
                self._ready.remove_waker(self._nudge)
            with self._guard:
                self._claimant = None
                woken, self._woken = self._woken, False
                hand_back = woken or (again is not None and again > 0)
                if hand_back:
                    self._asked_at = self._claimed_steps
            if hand_back:
                self._driver.wake(self)  # what came since the last step, or a backoff to time

    def _claimed_step(self) -> tuple[bool, float | None]:
        with self._guard:
            self._woken = False  # the step takes what woke it
            self._claimed_steps += 1
        return self._safe_step(driving=True)

    def _wait(self, timeout: float) -> bool:
        self.in_socket = True
        return self._fetcher.wait_answer(timeout, self._was_woken)

    def _was_woken(self) -> bool:
        return self._woken

    def _may_fetch(self) -> bool:
        """Whether a step would fetch: partitions to fetch, room in the buffer and in the Client's
        ``memory_limit`` (else ``wake`` is called once there is)."""
        return bool(self._epochs) and self._bytes < self._max_bytes and not self._memory.full(self, self.wake)

    def _nudge(self) -> None:
        """``ready``'s waker while claimed: a notification from another thread (a rebalance event,
        close) ends the claimant's wait; its own (records it buffered) need not."""
        with self._guard:
            if self._claimant is None or self._claimant == threading.get_ident():
                return
            self._woken = True
        self._fetcher.nudge()

    # ---- a step (the driver's thread, or poll()'s that claimed the prefetcher) ---------------------

    def step(self) -> float | None:
        """The driver's step: apply commands, take the answers that arrived, send the next fetches,
        buffer what came. Returns when to step again at the latest (a backoff), else None. Skipped
        while poll()'s thread runs the steps, or when it ran one since this was asked for: it covered
        whatever asked (it hands back to the driver what came after its last step, ``drive``)."""
        with self._guard:
            if self._claimant is not None or self._asked_at != self._claimed_steps:
                return None
            self._stepping = True
        try:
            return self._safe_step(driving=self.in_socket)[1]
        finally:
            with self._guard:
                self._stepping = False

    def _safe_step(self, driving: bool) -> tuple[bool, float | None]:
        """A step: (whether it fetches, when to step again at the latest: None when woken)."""
        try:
            return self._step(driving)
        except Exception as exc:  # a bug: surface it through poll() rather than dying silently
            log.exception("consumer fetch step failed")
            with self._lock:
                self._errors.append(SluiceError(f"the consumer's fetch failed: {exc!r}"))
                self._ready.notify_all()
            return False, None

    def _step(self, driving: bool) -> tuple[bool, float | None]:
        with self._lock:
            if self._closed:
                return False, None
            commands, self._commands = self._commands, []
        if commands:
            self._apply(commands)
        if not self._may_fetch():
            return False, None  # woken again by a command, or by poll() (of any consumer) freeing space
        fetcher = self._fetcher
        before = fetcher.positions()
        try:
            raws, again = fetcher.poll_raw(driving)
        except SluiceError as exc:
            # The fetcher paused the partition concerned (until a seek); poll() raises it.
            with self._lock:
                self._errors.append(exc)
                self._ready.notify_all()
            return True, 0.0  # the others go on fetching
        after = fetcher.positions()
        runs = decode_runs(raws, self._epochs, self._check_crcs, self.columnar)
        chunks = cut_chunks(runs, before, after, self._epochs)
        fetched_in = {(raw.topic, raw.partition): raw.leader_epoch for raw in raws}
        for chunk in chunks:
            chunk.leader_epoch = fetched_in.get(chunk.tp, -1)
        if chunks:
            with self._lock:
                if self._closed:
                    return False, None
                self._buffer.extend(chunks)
                nbytes = sum(c.nbytes for c in chunks)
                self._bytes += nbytes
                self._memory.add(nbytes)
                self._ready.notify_all()
        return True, again

    def _apply(self, commands: list[_Command]) -> None:
        fetcher = self._fetcher
        for cmd in commands:
            if cmd.offset is None:
                if self._epochs.pop(cmd.tp, None) is not None:
                    fetcher.remove(cmd.tp)
                continue
            topic = cmd.tp[0]
            if self._filters.get(topic) != cmd.filter:
                self._filters[topic] = cmd.filter
                fetcher.set_filter(topic, cmd.filter)
            self._epochs[cmd.tp] = cmd.fetch_epoch
            fetcher.seek(cmd.tp, cmd.offset, cmd.leader_epoch)


def decode_runs(
    raws: list[RawChunk], epochs: Mapping[TopicPartition, int], check_crcs: bool, columnar: bool = False
) -> list[tuple[TopicPartition, list[Record] | RecordColumns]]:
    """Decode each raw run of a partition still fetched (one per partition and response), as
    records, or as columns (``columnar``)."""
    runs: list[tuple[TopicPartition, list[Record] | RecordColumns]] = []
    decode = decode_columns if columnar else decode_records
    with decoding():  # the Fetcher's: Records hold no cycles, collections would double decoding
        for raw in raws:
            tp = (raw.topic, raw.partition)
            if tp not in epochs:
                continue  # removed while the response was in flight
            records = decode(raw.data, raw.topic, raw.partition, raw.start, check_crcs)
            if len(records):
                runs.append((tp, records))
    return runs


def cut_chunks(
    runs: Sequence[tuple[TopicPartition, list[Record] | RecordColumns]],
    before: Mapping[TopicPartition, int],
    after: Mapping[TopicPartition, int],
    epochs: Mapping[TopicPartition, int],
) -> list[Chunk]:
    """One chunk per run of one partition's records, plus empty chunks for partitions
    whose position moved without records. ``before``/``after``: the fetch positions
    around the round; ``epochs``: the fetch epoch of each fetched partition."""
    chunks: list[Chunk] = []
    last: dict[TopicPartition, Chunk] = {}
    for tp, recs in runs:
        epoch = epochs.get(tp)
        if epoch is None or not len(recs):
            continue
        if isinstance(recs, RecordColumns):
            nbytes = len(recs) * RECORD_OVERHEAD + sum(map(len, recs.values))
            chunk = Chunk(tp, epoch, [], recs.offsets[-1] + 1, nbytes, cols=recs)
        else:
            nbytes = len(recs) * RECORD_OVERHEAD + sum(map(len, map(_VALUE, recs)))
            chunk = Chunk(tp, epoch, recs, recs[-1].offset + 1, nbytes)
        chunks.append(chunk)
        last[tp] = chunk
    for tp, position in after.items():
        epoch = epochs.get(tp)
        if epoch is None:
            continue
        tail = last.get(tp)
        if tail is not None:
            tail.next_offset = max(tail.next_offset, position)
        elif position != before.get(tp):
            chunks.append(Chunk(tp, epoch, [], position, 0))
    return chunks
