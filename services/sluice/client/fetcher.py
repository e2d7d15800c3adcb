"""The low-level fetch API: read partitions from given positions, no group.

``client.fetcher(positions, filters)`` keeps a position per (topic, partition), and each answer moves the
positions to each partition's ``next_offset`` (also when a tag filter matched nothing). Per broker, it fetches
one of two ways:

- **Following** (the broker's wire protocol, ``max_wait_ms > 0``): one continuous fetch (``docs/wire.md``).
  The broker answers again from each answer's next offsets, so at a steady rate a record costs one frame, not
  a request and an answer, and the broker skips a request's parsing, validation and long-poll setup per round.
  The fetcher tracks where the broker reads next; a seek, a filter change, a partition added or removed, or an
  answer with an error makes it send a new fetch, which replaces the followed one. The fetcher follows on a
  lane of its client's one connection to the broker (``client.shared_wire``), and the broker sends it at most
  ``_FOLLOW_WINDOW`` answers beyond those ``fetch()`` took: a fetcher nobody reads holds that much, and stops
  only its own lane. One ``fetch()`` takes one answer with records; answers that arrived meanwhile wait for
  the next call. (Measured at 2,000 records/s: the broker spends 180 µs per record instead of about 250.)
- **Request by request** (gRPC ``FetchStream``, where the broker has no wire port): at most
  one Fetch in flight per broker, with an incremental fetch session (``fetch_session``).
  The next request is sent *before* the records of an answer are decoded, so the broker
  works while this process decodes.

Records are decoded with ``codec.batch.decode_records`` (columnar). Module map: ``fetch_state`` (state,
checks, the request encoder), ``fetch_errors`` (a partition's error: reset, back off and refresh, or raise),
``fetch_session`` (incremental sessions), ``fetch_validate`` (KIP-320: positions after a new leader),
``fetch_answer`` (an answer's effect; waiting for one by reading its connection on the caller's thread).

Caller: the CLI's ``consume``, the group consumer's prefetcher (``poll_raw``, on a shared driver).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from sluice.client.fetch_answer import Answers, Completion, advance, drive, nudge, throttled_answer, undrive
from sluice.client.fetch_errors import PartitionErrors
from sluice.client.fetch_session import FetchSession, PartitionFetchState, SessionRequest
from sluice.client.fetch_state import (
    RETRY_BACKOFF,
    AutoOffsetReset,
    BrokerState,
    PartitionState,
    RawChunk,
    TopicPartition,
    backoff,
    check_limits,
    check_offset,
    check_tp,
    decoding,
    earliest,
    fetch_request,
    place,
    wanted_by_broker,
)
from sluice.client.fetch_validate import PositionValidator
from sluice.client.links import BrokerLinks, FetchLane
from sluice.client.metadata import MetadataCache
from sluice.codec.batch import Record, decode_records
from sluice.codec.filter import parse_filter
from sluice.common.names import validate_topic
from sluice.common.peers import Peers
from sluice.common.wire import has_records
from sluice.errors import (
    BrokerNotAvailable,
    FetchSessionNotFound,
    InvalidFetchSessionEpoch,
    SluiceError,
    error_from_proto,
    raise_for_proto,
)
from sluice.v1 import broker_pb2

__all__ = ["AutoOffsetReset", "Fetcher", "RawChunk", "TopicPartition"]

log = logging.getLogger("sluice.fetcher")


#: Answers a followed fetch may get beyond those ``fetch()`` took, granted back two at a time (one LANE_CREDIT
#: frame, a broker wake-up, per two; docs/latency.md); more read-ahead measured slower (buffers to fault in).
_FOLLOW_WINDOW = 3


class Fetcher:
    """Fetches records of a fixed set of partitions from explicit positions.

    Not thread-safe: one thread calls ``fetch``/``seek``/``positions``; gRPC threads
    only hand responses over through a queue.
    """

    def __init__(
        self,
        channels: Peers,
        metadata: MetadataCache,
        positions: Mapping[TopicPartition, int],
        filters: Mapping[str, str] | None = None,
        *,
        max_wait_ms: int = 500,
        min_bytes: int = 1,
        max_bytes: int = 50 * 1024 * 1024,
        partition_max_bytes: int = 1024 * 1024,
        auto_offset_reset: AutoOffsetReset = "none",
        client_id: str = "",
        request_timeout: float = 30.0,
        use_sessions: bool = True,
        check_crcs: bool = True,
        links: BrokerLinks | None = None,
    ) -> None:
        check_limits(max_wait_ms, min_bytes, max_bytes, partition_max_bytes, auto_offset_reset)
        self._channels = channels
        self._metadata = metadata
        #: The client's links (shared connections); a fetcher made without one owns its own.
        self._own_links = links is None
        self._links = links if links is not None else BrokerLinks(channels, metadata, client_id)
        self._max_wait_ms = max_wait_ms
        self._partition_max_bytes = partition_max_bytes
        #: Encodes a session request: (request, continuous) -> FetchRequest.
        self._request = functools.partial(
            fetch_request,
            max_wait_ms=max_wait_ms,
            min_bytes=min_bytes,
            max_bytes=max_bytes,
            client_id=client_id,
        )
        self._request_timeout = request_timeout
        self._use_sessions = use_sessions
        self._check_crcs = check_crcs
        self._filters: dict[str, str] = {}
        for topic, expr in (filters or {}).items():
            validate_topic(topic)
            self._filters[topic] = parse_filter(expr).expression
        self._parts: dict[TopicPartition, PartitionState] = {}
        for tp, offset in positions.items():
            self._parts[check_tp(tp)] = PartitionState(check_offset(tp, offset))
        self._brokers: dict[str, BrokerState] = {}
        self._leaders: dict[TopicPartition, str | None] = {}
        self._need_metadata = True
        self._answers = Answers()
        self._errors: list[SluiceError] = []
        self._partition_errors = PartitionErrors(
            channels, metadata, auto_offset_reset, request_timeout, self._errors
        )
        #: KIP-320: positions to check against a new leader's log before fetching (fetch_validate).
        self._validator = PositionValidator(channels, request_timeout, self._errors)
        self._closed = False
        self._wakeup = threading.Event()

    # ---- public API ---------------------------------------------------------------------

    @property
    def on_completion(self) -> Callable[[], None] | None:
        """Called (from any thread, never blocking) after an answer is queued: see ``poll_raw``."""
        return self._answers.on_arrival

    @on_completion.setter
    def on_completion(self, callback: Callable[[], None] | None) -> None:
        self._answers.on_arrival = callback

    def fetch(self, timeout: float | None = None) -> list[Record]:
        """Records from the current positions, advancing them. ``timeout`` None: one round —
        wait for the next answer (a broker long-polls for at most ``max_wait_ms``) and return
        what it brought, possibly nothing. A number: keep fetching until records arrive or
        ``timeout`` seconds pass."""
        records: list[Record] = []
        chunks = self.fetch_raw(timeout)
        if chunks:
            check = self._check_crcs
            with decoding():
                for c in chunks:
                    records += decode_records(c.data, c.topic, c.partition, c.start, check)
        return records

    def fetch_raw(self, timeout: float | None = None) -> list[RawChunk]:
        """Like :meth:`fetch`, but hands back the encoded batches undecoded, for readers that
        decode a whole batch at once into another columnar form (the Spark source builds Arrow
        arrays from them). Records of a chunk below ``chunk.start`` were already consumed."""
        if self._closed:
            raise SluiceError("the fetcher is closed")
        self._raise_error()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            chunks: list[RawChunk] = []
            wait = self._send_fetches()
            self._raise_error()
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if wait is not None:  # nothing in flight: wait out a backoff (or a seek)
                if remaining is not None and remaining <= 0:
                    return chunks
                self._wakeup.wait(wait if remaining is None else min(wait, remaining))
                self._wakeup.clear()
                if deadline is None:
                    return chunks
                continue
            if drive(self._answers, self._brokers.values(), remaining) and deadline is not None:
                remaining = max(deadline - time.monotonic(), 0.0)
            item = self._answers.take(remaining)
            if item is None:
                return chunks
            self._handle(item, chunks)
            self._take_arrived(chunks)
            if chunks:
                return chunks
            if self._errors:
                self._raise_error()
            if deadline is None or time.monotonic() >= deadline:
                return chunks

    def poll_raw(self, driving: bool = False) -> tuple[list[RawChunk], float | None]:
        """:meth:`fetch_raw` without waiting, for a caller driven by ``on_completion`` (the
        consumer's shared fetch driver): take the answers that arrived (as ``fetch_raw``), send
        what can be sent. Returns the chunks and None when a request is in flight (``on_completion``
        tells when its answer comes), else the seconds until the next call is due (0: an answer is
        held or an error waits; else the end of a backoff). ``driving``: the caller waits for the
        answers with ``wait_answer`` (its lanes stay driven), else the connections' threads read."""
        if self._closed:
            raise SluiceError("the fetcher is closed")
        self._raise_error()
        if not driving:
            undrive(self._brokers.values())
        chunks: list[RawChunk] = []
        held = self._take_arrived(chunks)
        wait = self._send_fetches()
        if not chunks:
            self._raise_error()
        elif self._errors or held:
            wait = 0.0  # these records first; the next call takes the held answer, raises the error
        return chunks, wait

    def wait_answer(self, timeout: float, stop: Callable[[], bool]) -> bool:
        """For a caller of ``poll_raw(driving=True)`` (the group consumer's ``poll()``): wait up to
        ``timeout`` seconds for an answer, or until ``stop()``, reading the connection on this thread,
        when the one request in flight is a followed lane on a connection no other owner reads or
        needs the reader thread for (True). Else False at once: the connections' threads read."""
        return drive(self._answers, self._brokers.values(), timeout, stop)

    def arrived(self) -> int:
        """Answers arrived and not taken yet (any thread: a hint)."""
        return self._answers.waiting()

    def nudge(self) -> None:
        """End a ``wait_answer`` early (any thread, after making the caller's ``stop()`` True)."""
        nudge(self._answers)

    @property
    def truncations(self) -> int:
        """Positions moved back after a leader change because the records past them were truncated."""
        return self._validator.truncations

    def positions(self) -> dict[TopicPartition, int]:
        """The next offset to fetch of every partition."""
        return {tp: st.position for tp, st in self._parts.items()}

    def highwater(self, tp: TopicPartition) -> int | None:
        """``tp``'s high watermark as of the last answer for it (None: none since it was added)."""
        st = self._parts.get(check_tp(tp))  # any thread: one dict read and one attribute read
        return st.high_watermark if st is not None and st.high_watermark >= 0 else None

    def seek(self, tp: TopicPartition, offset: int, leader_epoch: int = -1) -> None:
        """Fetch ``tp`` from ``offset`` next (adds the partition if it is new). ``leader_epoch``: the
        one committed with ``offset`` (KIP-320), checked with the leader before fetching if it changed.

        An answer already in flight for the old position is discarded.
        """
        tp = check_tp(tp)
        st = self._parts.get(tp)
        if st is None:
            st = self._parts[tp] = PartitionState(check_offset(tp, offset))
            self._need_metadata = True
        st.seek(check_offset(tp, offset), leader_epoch)
        self._validator.pending = self._validator.pending or st.validate
        self._wakeup.set()

    def remove(self, tp: TopicPartition) -> None:
        """Stop fetching ``tp``."""
        self._parts.pop(tp, None)
        self._leaders.pop(tp, None)

    def set_filter(self, topic: str, expression: str | None) -> None:
        """Change (or, with None, remove) the tag filter of ``topic``."""
        if expression is None:
            self._filters.pop(topic, None)
        else:
            self._filters[topic] = parse_filter(expression).expression

    def close(self) -> None:
        """Stop; answers still in flight are dropped."""
        self._closed = True
        for broker in self._brokers.values():
            if broker.stream is not None:
                broker.stream.close()
        if self._own_links:
            self._links.close()
        self._wakeup.set()

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- requests -----------------------------------------------------------------------

    def _send_fetches(self) -> float | None:
        """Send a Fetch to every idle broker with partitions to fetch.

        Returns None when at least one request is in flight (wait on the completion
        queue), else how long until a backoff ends (wait on the wake-up event).
        """
        now = time.monotonic()
        if self._need_metadata:
            self._refresh_metadata()
        if self._validator.pending:
            self._need_metadata = self._validator.run(self._parts, self._leaders) or self._need_metadata
        wanted, next_at, unplaced = wanted_by_broker(
            self._parts, self._leaders, self._filters, self._partition_max_bytes, now
        )
        self._need_metadata = self._need_metadata or unplaced
        for address, b in self._brokers.items():
            if b.follow is not None and address not in wanted:
                self._stop_following(b)  # nothing left to fetch there
        in_flight = any(b.in_flight is not None for b in self._brokers.values())
        for address, parts in wanted.items():
            broker = self._brokers.get(address)
            if broker is None:
                broker = self._brokers[address] = BrokerState(address, FetchSession(self._use_sessions))
            if broker.in_flight is not None:
                if broker.follow is not None and broker.follow != parts:
                    self._send(broker, parts)  # a seek, a filter, a partition changed: follow anew
                continue
            if broker.backoff_until > now:
                next_at = earliest(next_at, broker.backoff_until)
                continue
            self._send(broker, parts)
            in_flight = True
        if in_flight:
            return None
        return max((next_at if next_at is not None else now + RETRY_BACKOFF) - now, 0.0)

    def _send(self, broker: BrokerState, parts: dict[TopicPartition, PartitionFetchState]) -> None:
        address = broker.address
        try:
            if broker.stream is None:
                broker.stream = self._links.fetch(address)
        except SluiceError as exc:
            req = broker.in_flight = broker.session.build(parts)
            broker.follow = None
            failure = BrokerNotAvailable(f"cannot fetch from {address}: {exc}")
            self._answers.put((address, req, failure, False))
            return
        link = broker.stream
        if isinstance(link, FetchLane) and self._max_wait_ms > 0:
            self._follow(broker, link, parts)
            return
        req = broker.session.build(parts)
        broker.in_flight = req
        broker.follow = None
        complete = self._answers.put
        link.send(
            self._request(req, False),
            self._max_wait_ms / 1000 + self._request_timeout,
            lambda outcome: complete((address, req, outcome, False)),
        )

    def _follow(
        self,
        broker: BrokerState,
        link: FetchLane,
        parts: dict[TopicPartition, PartitionFetchState],
    ) -> None:
        """Start following ``parts`` on ``broker`` (replacing what it followed)."""
        req = SessionRequest(0, -1, dict(parts), [], dict(parts))  # sessionless, as continuous is
        broker.in_flight = req
        broker.follow = dict(parts)
        address = broker.address
        complete = self._answers.put

        def on_answer(outcome: Any) -> bool:  # the connection's reader thread: never blocks
            complete((address, req, outcome, True))
            if isinstance(outcome, SluiceError):
                return False
            return error_from_proto(outcome.error) is None and all(
                error_from_proto(p.error) is None for p in outcome.partitions
            )

        link.follow(
            self._request(req, True),
            self._max_wait_ms / 1000 + self._request_timeout,
            _FOLLOW_WINDOW,
            on_answer,
        )

    def _stop_following(self, broker: BrokerState) -> None:
        """End ``broker``'s followed fetch: close its lane (the next fetch opens another)."""
        broker.in_flight = None
        broker.follow = None
        if broker.stream is not None:
            broker.stream.close()
            broker.stream = None

    # ---- responses ----------------------------------------------------------------------

    def _take_arrived(self, chunks: list[RawChunk]) -> bool:
        """Handle the answers that arrived, one followed answer's records per call (True: the next is
        held, its lane's credit with it; taking all measured 20-25% more CPU per record, 2-6 times the
        records alive: docs/architecture.md). A gRPC answer is still taken: its broker waits on it."""
        while (item := self._answers.take_nowait()) is not None:
            if chunks and item[3]:
                self._answers.hold(item)
                return True
            self._handle(item, chunks)
        return False

    def _handle(self, item: Completion, chunks: list[RawChunk]) -> None:
        address, req, outcome, followed = item
        broker = self._brokers.get(address)
        if broker is None or broker.in_flight is not req or self._closed:
            return  # an answer to a request replaced or abandoned since
        followed_lane = broker.stream if followed and isinstance(broker.stream, FetchLane) else None
        if followed_lane is not None and not isinstance(outcome, SluiceError) and has_records(outcome):
            # Room for the next answer, which the broker reads meanwhile (an empty one used none).
            followed_lane.grant()
        following = broker.follow
        resp = self._accepted(broker, outcome)
        if resp is None:
            return
        broker.failures = 0
        if following is None:
            broker.in_flight = None
            broker.session.on_response(req, resp.session_id)
        # Advance positions first, then send the next request, then decode: the broker
        # prepares the next answer while this thread decodes the current one.
        ended, lost_leader = advance(self._parts, self._partition_errors, req, following, resp, chunks)
        self._need_metadata = self._need_metadata or lost_leader
        if following is not None:
            if not ended:
                return  # the broker goes on by itself
            self._end_request(broker)  # it stopped following at this answer
        if not self._closed and broker.backoff_until <= time.monotonic():
            self._send_to(broker)

    def _accepted(self, broker: BrokerState, outcome: Any) -> broker_pb2.FetchResponse | None:
        """The answer, or None when it failed as a whole (handled here: session reset, backoff)."""
        try:
            if isinstance(outcome, SluiceError):
                raise outcome
            resp: broker_pb2.FetchResponse = outcome
            raise_for_proto(resp.error)
            return throttled_answer(broker, resp)  # a quota's throttle_time_ms delays the next request
        except (FetchSessionNotFound, InvalidFetchSessionEpoch) as exc:
            log.debug("fetch session with %s reset: %s", broker.address, exc)
            self._end_request(broker)
        except SluiceError as exc:
            self._end_request(broker)
            if not exc.retriable:
                self._errors.append(exc)
                return None
            broker.failures += 1
            broker.backoff_until = time.monotonic() + backoff(broker.failures)
            self._need_metadata = True
            log.debug("fetch from %s failed: %s", broker.address, exc)
        return None

    def _end_request(self, broker: BrokerState) -> None:
        """The broker will not answer the request in flight again (an error, or it was answered)."""
        broker.session.reset()
        broker.in_flight = None
        broker.follow = None

    def _send_to(self, broker: BrokerState) -> None:
        """Send the next request to ``broker`` right away (pipelining), if it has work."""
        now = time.monotonic()
        parts: dict[TopicPartition, PartitionFetchState] = {}
        for tp, st in self._parts.items():
            if st.paused or st.validate or st.backoff_until > now or self._leaders.get(tp) != broker.address:
                continue
            parts[tp] = st.fetch_state(self._partition_max_bytes, self._filters.get(tp[0], ""))
        if parts:
            self._send(broker, parts)

    def _refresh_metadata(self) -> None:
        topics = sorted({tp[0] for tp in self._parts})
        self._need_metadata = False
        if not topics:
            return
        try:
            md = self._metadata.get(topics, refresh=bool(self._leaders), retry=False)
        except SluiceError as exc:
            if not exc.retriable:
                raise
            log.debug("metadata refresh failed: %s", exc)
            self._need_metadata = True
            return
        pending = place(md, self._parts, self._leaders, self._errors)
        self._validator.pending = self._validator.pending or pending

    def _raise_error(self) -> None:
        if self._errors:
            raise self._errors.pop(0)
