"""The producer's background sender: drains ready batches into Produce requests.

One thread per producer. It sleeps on the producer's Condition until a batch is
ready (full, lingered, flushed), a retry backoff or a delivery deadline ends, or
metadata must be refreshed — no polling. Each wake-up it sends ONE Produce request
per broker holding the ready batches of every partition that broker hosts (at most
``max_in_flight`` requests per broker; per partition, one run of batches without
idempotence, up to ``max_in_flight`` batches pipelined with it: ``Accumulator``). Requests
travel on one long-lived ProduceStream per broker (``client.streams``), pipelined
and answered in order.

Two shortcuts keep thread wake-ups off the per-record path (each costs tens of
microseconds of CPU and a GIL hand-over, and with one request per record the
producer's CPU is what latency under load depends on):
- the stream's reader thread settles each answer itself (``_on_done``, under the
  producer's lock), completes the futures, sends what the answer made ready (the
  partition's next batch), and wakes this thread only when it has work: a batch
  that becomes ready later (linger, retry backoff), metadata to refresh, or
  flush/close/space waiters;
- with ``linger=0`` the thread calling ``send()`` sends a new batch at once
  (``send_ready``).

Without idempotence, callbacks of one partition run in order: a partition has one
request in flight, and its next batch is sent only after the previous one is settled.
With it, a partition's batches are pipelined and their order is kept by sequence
numbers: the broker appends them in order or refuses a gap (OUT_OF_ORDER_SEQUENCE,
retried in order behind the failed batch: ``Idempotence.echoed_gap``).

Retriable errors (``SluiceError.retriable``, plus UNKNOWN_TOPIC_OR_PARTITION while
the coordinator still knows the topic) put the batch back at the head of its
partition after a doubling backoff, until ``retries`` or ``delivery_timeout`` runs
out; routing errors also refresh the metadata. Other errors fail the batch's
futures with the typed error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sluice.client.links import BrokerLink, BrokerLinks
from sluice.client.metadata import MetadataCache
from sluice.client.producer.accumulator import Accumulator, ProducerBatch
from sluice.client.producer.config import ProducerConfig
from sluice.client.producer.idempotence import Idempotence
from sluice.client.stages import stage
from sluice.client.throttles import ThrottleWindows
from sluice.common.peers import Peers
from sluice.errors import (
    BrokerNotAvailable,
    FencedLeaderEpoch,
    InvalidProducerEpoch,
    NotLeader,
    OutOfOrderSequence,
    RequestTimedOut,
    SluiceError,
    UnknownLeaderEpoch,
    UnknownProducerId,
    UnknownTopicOrPartition,
    error_from_proto,
    raise_for_proto,
)
from sluice.v1 import broker_pb2

__all__ = ["Sender"]

log = logging.getLogger("sluice.producer")

_QUEUE = stage("producer_queue")
_ACK = stage("producer_ack")

# Errors after which the partition's broker may have changed: ask the coordinator.
_ROUTING_ERRORS = (NotLeader, UnknownTopicOrPartition, BrokerNotAvailable, RequestTimedOut)
# A leader change under way (its broker gone, or another leader named): retried until the delivery
# timeout without counting against ``retries``. A failover takes the broker session timeout plus an
# election, longer than five doubling backoffs; the user must not see it (docs/replication.md,
# "Consumers across a failover").
_LEADER_CHANGE = (NotLeader, BrokerNotAvailable, FencedLeaderEpoch, UnknownLeaderEpoch)

# (batch, base_offset, log_append_time_ms, error) to settle outside the lock.
_Outcome = tuple[ProducerBatch, int, int, SluiceError | None]

_Stream = BrokerLink
# One Produce request to make: broker address, its stream (or why there is none), the batches
# (grouped by partition).
_Request = tuple[str, _Stream | SluiceError, list[ProducerBatch]]


class Sender:
    """Moves batches from the accumulator to the brokers and settles their results.

    Caller: Producer (start, close). Everything that touches the accumulator runs
    with the producer's lock (``cond``) held; RPCs, metadata refreshes and user
    callbacks run without it.
    """

    def __init__(
        self,
        topic: str,
        accumulator: Accumulator,
        cond: threading.Condition,
        config: ProducerConfig,
        *,
        channels: Peers,
        metadata: MetadataCache,
        links: BrokerLinks,
        leaders: list[str | None],
        clock: Callable[[], float],
        idempotence: Idempotence | None = None,
        client_id: str = "",
    ) -> None:
        self._topic = topic
        self._idem = idempotence
        self._client_id = client_id
        self._acc = accumulator
        self._cond = cond
        self._cfg = config
        self._channels = channels
        self._metadata = metadata
        self._links = links
        self._clock = clock
        self._leaders = leaders
        self._need_metadata = any(a is None for a in leaders)
        self._last_refresh = float("-inf")
        self._refresh_interval = config.retry_backoff.total_seconds()
        self._request_timeout = config.request_timeout.total_seconds()
        self._backoff = config.retry_backoff.total_seconds()
        self._backoff_max = config.retry_backoff_max.total_seconds()
        self._requests_in_flight: dict[str, int] = {}
        self._epoch_retry_at = 0.0
        #: Brokers whose last answer said we are throttled (KIP-219): nothing goes to them until then.
        self._throttle = ThrottleWindows()
        self._streams: dict[str, _Stream] = {}
        #: The loop has ended: answers arriving now belong to batches already failed.
        self._stopped = False
        #: Set by Producer.close when its timeout ran out: fail what is left and stop.
        self.force_close = False
        #: The exception that killed the thread, if any.
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"sluice-producer-{topic}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None) -> bool:
        """Wait for the thread to end; True if it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ---- the loop ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
            self._close_streams()
        except BaseException as exc:
            with self._cond:
                self._stopped = True
            self._close_streams()
            log.exception("the producer's sender thread failed")
            self.failure = exc
            with self._cond:
                left = self._acc.abort(include_in_flight=True)
                self._cond.notify_all()
            err = SluiceError(f"the producer's sender thread failed: {exc!r}")
            for b in left:
                b.result.complete(-1, -1, err)

    def _loop(self) -> None:
        while True:
            done: list[_Outcome] = []
            sends: list[_Request] = []
            refresh = stop = new_epoch = False
            with self._cond:
                while True:
                    now = self._clock()
                    done += self._expire(now)
                    if self.force_close:
                        err = SluiceError("the producer was closed before the record was delivered")
                        done += [(b, -1, -1, err) for b in self._acc.abort(include_in_flight=True)]
                        stop = True
                        break
                    if self._acc.closing and not self._requests_in_flight and self._acc.empty:
                        stop = True
                        break
                    refresh = self._need_metadata and now >= self._last_refresh + self._refresh_interval
                    new_epoch = self._epoch_due(now)
                    ready, next_at = self._acc.ready(now)
                    sends = self._drain(ready)
                    if done or sends or refresh or new_epoch:
                        break
                    if self._need_metadata:
                        at = self._last_refresh + self._refresh_interval
                        next_at = at if next_at is None else min(next_at, at)
                    expiry = self._acc.next_expiry()
                    if expiry is not None:
                        next_at = expiry if next_at is None else min(next_at, expiry)
                    if (unthrottled := self._throttle.next_end(now)) is not None:
                        next_at = unthrottled if next_at is None else min(next_at, unthrottled)
                    self._cond.wait(None if next_at is None else max(next_at - now, 0.0))
                if stop:
                    self._stopped = True
                self._cond.notify_all()  # buffer space may have been freed
            for batch, base_offset, append_time, error in done:
                batch.result.complete(base_offset, append_time, error)
            if refresh:
                self._refresh_metadata()
            if new_epoch:
                self._move_to_new_epoch()
            self._transmit(sends)
            if stop:
                return

    def _expire(self, now: float) -> list[_Outcome]:
        """Fail the batches past their delivery timeout (lock held)."""
        out: list[_Outcome] = []
        for b in self._acc.expire(now):
            if self._idem is not None and b.attempts > 0:
                self._gap(b, now)  # sent before, perhaps written: what follows it needs a new epoch
            out.append((b, -1, -1, _expired(b, self._cfg)))
        return out

    def send_ready(self) -> None:
        """Send what is ready now from the calling thread (``send()`` under ``linger=0``).

        Anything unusual (metadata to refresh, closing) is left to the sender thread."""
        with self._cond:
            blocked = self._idem is not None and self._idem.needs_new_epoch
            if self._need_metadata or self._stopped or self.force_close or self._acc.closing or blocked:
                self._cond.notify_all()
                return
            sends = self._drain(self._acc.ready(self._clock())[0])
        self._transmit(sends)

    def _drain(self, ready: list[int]) -> list[_Request]:
        """Group ready partitions by broker and take their batches (lock held)."""
        if self._idem is not None and self._idem.needs_new_epoch:
            return []  # nothing goes out under the old epoch once a gap was seen
        by_broker: dict[str, list[int]] = {}
        now = self._clock()
        for p in ready:
            address = self._leaders[p]
            if address is None:
                self._need_metadata = True
            elif self._throttle.blocked(address, now):
                continue  # it said we are over our quota: wait out its throttle time
            elif self._requests_in_flight.get(address, 0) < self._cfg.max_in_flight:
                by_broker.setdefault(address, []).append(p)
        sends = []
        for address, parts in by_broker.items():
            batches = self._acc.drain(parts, self._cfg.max_request_size)
            if self._idem is not None:
                for b in batches:
                    self._idem.stamp(b)
            if batches:
                self._requests_in_flight[address] = self._requests_in_flight.get(address, 0) + 1
                sends.append((address, self._stream(address), batches))
        return sends

    # ---- requests and responses ----------------------------------------------------------

    def _transmit(self, sends: list[_Request]) -> None:
        for address, stream, batches in sends:
            self._send(address, stream, batches)

    def _send(self, address: str, stream: _Stream | SluiceError, batches: list[ProducerBatch]) -> None:
        """Encode (first attempt only) and send one Produce request, asynchronously (lock not held).

        ``batches`` come grouped by partition; a partition's batches travel
        concatenated in one ProducePartition and are appended in that order.
        """
        if isinstance(stream, SluiceError):
            self._on_done(address, batches, stream)
            return
        try:
            runs: dict[int, list[bytes]] = {}
            for b in batches:
                runs.setdefault(b.partition, []).append(b.encode())
            request = broker_pb2.ProduceRequest(
                acks=self._cfg.acks,
                timeout_ms=int(self._request_timeout * 1000),
                partitions=[
                    broker_pb2.ProducePartition(
                        topic=self._topic, partition=p, records=raw[0] if len(raw) == 1 else b"".join(raw)
                    )
                    for p, raw in runs.items()
                ],
            )
        except SluiceError as exc:
            self._on_done(address, batches, exc)
            return
        # Once per request (a batch of records): how long its oldest batch waited, then the round trip.
        _QUEUE.observe(max(self._clock() - min(b.created for b in batches), 0.0))
        sent = time.perf_counter()

        def done(outcome: Any) -> None:
            _ACK.observe(time.perf_counter() - sent)
            self._on_done(address, batches, outcome)

        # A little more than the broker's own timeout, so its answer wins the race.
        stream.send(request, self._request_timeout + 5.0, done)

    def _stream(self, address: str) -> _Stream | SluiceError:
        """The link to ``address`` (lock held; the connection itself opens on first use)."""
        stream = self._streams.get(address)
        if stream is None:
            try:
                stream = self._links.produce(address)
            except SluiceError as exc:
                return exc
            self._streams[address] = stream
        return stream

    def _close_streams(self) -> None:
        with self._cond:
            streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.close()

    def _on_done(self, address: str, batches: list[ProducerBatch], outcome: Any) -> None:
        """A request's answer or failure (the stream's reader thread, or a failed send): settle
        it, complete its futures and send what it made ready, all in this thread."""
        done: list[_Outcome] = []
        sends: list[_Request] = []
        with self._cond:
            if self._stopped:
                return  # the loop already failed these batches
            now = self._clock()
            self._settle(address, batches, outcome, now, done)
            acc = self._acc
            ready, next_at = acc.ready(now)
            if not (self._need_metadata or self.force_close):
                sends = self._drain(ready)
            # Wake the sender thread or flush()/close()/send() only when one of them has work: a
            # batch that becomes ready later (its linger or retry backoff: the sender's timer), a
            # batch put back for a retry, metadata to refresh, or someone waiting. Under linger=0
            # none of these holds in steady state, so no thread is woken per answer.
            if (
                next_at is not None
                or len(done) < len(batches)
                or self._need_metadata
                or acc.flushing
                or acc.closing
                or acc.waiting_for_space
                or self._throttle.next_end(now) is not None  # the loop's timer ends the wait
            ):
                self._cond.notify_all()
        for batch, base_offset, append_time, error in done:
            batch.result.complete(base_offset, append_time, error)
        self._transmit(sends)

    def _settle(
        self, address: str, batches: list[ProducerBatch], outcome: Any, now: float, done: list[_Outcome]
    ) -> None:
        """Apply one request's outcome to its batches (lock held)."""
        n = self._requests_in_flight.get(address, 1) - 1
        if n > 0:
            self._requests_in_flight[address] = n
        else:
            self._requests_in_flight.pop(address, None)
        try:
            if isinstance(outcome, SluiceError):
                raise outcome
            resp: broker_pb2.ProduceResponse = outcome
            self._throttle.throttled(address, resp.throttle_time_ms, now)
            raise_for_proto(resp.error)  # the broker refused the whole request
        except SluiceError as exc:
            if isinstance(exc, BrokerNotAvailable):
                exc = BrokerNotAvailable(f"broker {address}: {exc.message}")
            for b in batches:
                self._retry_or_fail(b, exc, now, done)
            return
        by_partition = {r.partition: r for r in resp.partitions if r.topic == self._topic}
        next_offset: dict[int, int] = {}
        for b in batches:
            r = by_partition.get(b.partition)
            if r is None:
                err: SluiceError = BrokerNotAvailable(
                    f"broker {address} did not answer for partition {b.partition}"
                )
                self._retry_or_fail(b, err, now, done)
            elif (refusal := error_from_proto(r.error)) is not None:
                self._retry_or_fail(b, refusal, now, done)
            else:
                # Batches of one partition were appended in order: offsets follow on.
                base = next_offset.get(b.partition, r.base_offset)
                next_offset[b.partition] = base + b.record_count if base >= 0 else base
                self._acc.complete(b)
                done.append((b, base, r.log_append_time_ms, None))

    def _retry_or_fail(
        self, batch: ProducerBatch, err: SluiceError, now: float, done: list[_Outcome]
    ) -> None:
        if isinstance(err, _ROUTING_ERRORS):
            self._need_metadata = True
        retriable = err.retriable or isinstance(err, UnknownTopicOrPartition)
        counted = not isinstance(err, _LEADER_CHANGE)
        idem = self._idem
        gap = False
        if idem is not None:
            if isinstance(err, UnknownProducerId):
                # The broker forgot us; nothing of the partition's unacknowledged batches is there.
                idem.forget_partition(batch.partition, self._acc.unacknowledged(batch.partition))
                retriable = True
            elif isinstance(err, OutOfOrderSequence):
                # An older batch's failure echoed: retried in order behind it, and not counted (this
                # batch did nothing wrong). Else acknowledged batches are missing: fail, then a new epoch.
                retriable = idem.echoed_gap(batch, self._acc.sent_before(batch))
                counted, gap = not retriable, not retriable
        if retriable and (batch.attempts <= self._cfg.retries or not counted) and now < batch.deadline:
            backoff = min(self._backoff * 2 ** (batch.attempts - 1), self._backoff_max)
            self._acc.reenqueue(batch, now + backoff)
            log.debug("retrying %r in %.3f s after %s", batch, backoff, err)
            return
        pipelined = self._acc.max_in_flight_batches > 1 and not isinstance(err, InvalidProducerEpoch)
        if gap or (pipelined and len(self._acc.unacknowledged(batch.partition)) > 1):
            # A real gap, or this batch failing for good with later ones in flight: they go under a new epoch.
            self._gap(batch, now)
        self._acc.complete(batch)
        done.append((batch, -1, -1, err))

    def _gap(self, batch: ProducerBatch, now: float) -> None:
        """``batch`` is missing for good from its partition's sequence (lock held): the producer moves to a
        new epoch, and the partition waits for its batches in flight before anything else goes out."""
        assert self._idem is not None
        if not self._idem.needs_new_epoch:
            self._epoch_retry_at = now
        self._idem.gap(batch)
        self._acc.hold(batch.partition)

    def _epoch_due(self, now: float) -> bool:
        return self._idem is not None and self._idem.needs_new_epoch and now >= self._epoch_retry_at

    def _move_to_new_epoch(self) -> None:
        """After OUT_OF_ORDER_SEQUENCE: the same id under the next epoch (without the lock), then every
        partition starts at sequence 0. A failure is retried after the backoff; sends wait meanwhile."""
        assert self._idem is not None
        try:
            identity = self._idem.new_epoch(self._metadata, self._client_id, self._request_timeout)
        except SluiceError as exc:
            log.warning("could not move the producer to a new epoch (%s); retrying", exc)
            with self._cond:
                self._epoch_retry_at = self._clock() + self._backoff_max
            return
        with self._cond:
            self._idem.adopt(identity)
            self._cond.notify_all()

    def _refresh_metadata(self) -> None:
        """Ask the coordinator where the partitions are (without the lock)."""
        failed: list[ProducerBatch] = []
        try:
            md = self._metadata.get([self._topic], refresh=True, retry=False)
        except SluiceError as exc:
            log.debug("metadata refresh failed: %s", exc)
            md = None
        with self._cond:
            self._last_refresh = self._clock()
            if md is not None:
                if self._topic in md.unknown_topics:
                    failed = self._acc.abort(include_in_flight=False)
                    self._need_metadata = False
                else:
                    leaders = [md.leader_address(self._topic, p) for p in range(self._acc.partitions)]
                    self._leaders[:] = leaders
                    self._need_metadata = any(a is None for a in leaders)
            self._cond.notify_all()
        if failed:
            err = UnknownTopicOrPartition(f"topic {self._topic!r} no longer exists")
            for b in failed:
                b.result.complete(-1, -1, err)


def _expired(batch: ProducerBatch, cfg: ProducerConfig) -> RequestTimedOut:
    return RequestTimedOut(
        f"{batch.record_count} record(s) for partition {batch.partition} expired: not delivered within "
        f"delivery_timeout={cfg.delivery_timeout.total_seconds():g} s"
    )
