"""One fetch loop per partition with active subscriptions.

The feed reads the partition from its broker, starting at the lowest read position among the
subscriptions that have read-ahead room, indexes each fetched batch once (``batch_views``: header,
columns, offsets; CRC checked, no record decoded) with one ``Message`` per record pointing into it
(``messages_of``), and offers the same message objects to every subscription whose read position falls
inside what was fetched. A subscription that is full (read-ahead bytes reached) is left
behind and caught up by a later fetch from its own position; the fetch never waits for it.

While every subscription is caught up the fetch parks on the broker (``max_wait_ms``) and returns as soon
as records are appended, which is what keeps end-to-end latency low. A subscription joining at an
earlier position ``kick``s the feed, which starts reading again from there; a subscription that
dispatched messages tells the feed it has ``room`` again, which matters only to an idle feed or one
reading beyond that subscription's position: ``room`` runs on every dispatch (thousands of times a
second at a steady rate), so it costs a comparison otherwise.

On the broker's wire port (``docs/wire.md``) the fetch is continuous: the broker fetches again from
each answer's end by itself and sends answer after answer. The feed follows it with a
``FetchFollower`` and does all its per-answer work (errors, watermarks, delivery, deciding whether to
go on) in the follower's read callback. Why not a task awaiting each answer: at a steady rate of one
record per answer, the coroutine, task, timeout and wake-up per answer were a fifth of the
dispatcher's CPU. The feed task only does what must wait or may block: sleeping while nobody wants
records, opening followers, backing off after a failure, moving subscriptions past a log start that
moved (``ListOffsets``). The broker moves a continuous fetch only when a new request arrives, so a
feed that must read from elsewhere (a subscription behind, or one ahead of a reader left behind)
closes the follower and opens another there. While every subscription is full the follower stops
reading: the broker then stops fetching once the socket buffers are full, and the feed goes on, from
the answers it had not read yet, as soon as a subscription has room again.

A broker without a wire port is read with one ``Broker.FetchStream`` call kept open per feed, one
long-poll at a time; ``kick``/``room`` cancel a parked fetch that starts beyond where reading must
now start (closing the call, the next fetch opens another), and a broker without FetchStream
(``UNIMPLEMENTED``) is asked with unary ``Fetch`` from then on. ``SLUICE_CLIENT_TRANSPORT`` is the
SDK's setting and does not apply here: a broker that serves a wire port serves the feeds on it.

Leader changes (KIP-320, ``epoch_check.py``): fetches carry the metadata's leader epoch, and before the feed
reads under a newer one it asks the leader where the epoch of its last record ends; below what it read,
the log was truncated (an unclean election) and every subscription is moved back there (``truncated``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

import grpc

from sluice.codec.batch import batch_views
from sluice.common.backoff import Backoff
from sluice.common.list_offsets import EARLIEST
from sluice.common.peers import AioPeers
from sluice.common.rpc import error_from_rpc, is_unimplemented
from sluice.common.wire_aio import FetchFollower
from sluice.dispatcher.cluster import ClusterView, CoordinatorLink
from sluice.dispatcher.epoch_check import FeedEpochs
from sluice.dispatcher.epochs import EpochTrail
from sluice.dispatcher.feed_call import FetchCall, current_task_cancelling
from sluice.dispatcher.messages import Message, messages_of
from sluice.errors import BrokerNotAvailable, OffsetOutOfRange, SluiceError, error_from_proto
from sluice.v1 import broker_pb2

log = logging.getLogger(__name__)

__all__ = ["FeedTarget", "PartitionFeed"]

#: Seconds a fetch may take past max_wait before its broker counts as hung; stop() tries STOP_ATTEMPTS times.
FETCH_GRACE, STOP_WAIT_S, STOP_ATTEMPTS = 10.0, 1.0, 5

#: A failed fetch is retried after the peer layer's backoff, from 50 ms (not its 100 ms: a feed is on the
#: delivery path, and most failures are a broker restart the next fetch already survives) to its 2 s.
_FIRST_BACKOFF = 0.05
_MAX_BACKOFF = 2.0


class FeedTarget(Protocol):
    """A subscription as its feed sees it (``service.SubscriptionRuntime``)."""

    def read_position(self, partition: int) -> int | None: ...
    def wants(self, partition: int) -> bool: ...
    def within_budget(self) -> bool: ...  # False: offer it nothing (``budget.py``)
    def offer(self, partition: int, messages: list[Message], start: int, next_offset: int) -> None: ...
    def skip_to(self, partition: int, position: int) -> None: ...
    def follow_epochs(self, partition: int, trail: EpochTrail) -> None: ...  # what the feed read, by epoch
    def truncated(self, partition: int, end: int) -> None: ...  # the log lost everything from ``end``


class PartitionFeed:
    def __init__(
        self,
        topic: str,
        partition: int,
        link: CoordinatorLink,
        channels: AioPeers,
        targets: Callable[[], list[FeedTarget]],
        max_wait_ms: int,
        max_bytes: int,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self._link = link
        self._channels = channels
        self._targets = targets
        self._max_wait_ms = max_wait_ms
        self._max_bytes = max_bytes
        #: Wakes the feed task: something changed that it must look at.
        self._kick = asyncio.Event()
        self._backoff = Backoff(_FIRST_BACKOFF, _MAX_BACKOFF)
        #: The offset the task is working at, for its log lines.
        self._offset = -1
        #: What was read in which leader epoch, checked after a leader change (``epoch_check.py``).
        self.epochs = FeedEpochs(topic, partition)

        # ---- the wire: a continuous fetch followed in callbacks ----
        self._follower: FetchFollower | None = None
        #: Where the follower's next answer starts (its previous answer's end), or -1 without one.
        self._following = -1
        #: The broker (gRPC address) the follower reads, and the metadata that said so.
        self._follow_broker = ""
        self._follow_view: ClusterView | None = None
        #: Set while answers are offered to subscriptions: they dispatch, and so call room() back.
        self._delivering = False
        #: A follower's failure, or the offset its answer said is out of range: for the task.
        self._failure: Exception | None = None
        self._out_of_range_at = -1

        # ---- gRPC: one long-poll at a time ----
        #: The FetchStream call fetches travel on, and the broker (gRPC address) it leads to.
        self._call: FetchCall | None = None
        self._call_broker = ""
        self._fetch_offset = -1
        #: The fetch in flight, and whether kick()/room() cancelled it (a wasted long-poll).
        self._fetching: asyncio.Future[broker_pb2.FetchResponse] | None = None
        self._fetch_cancelled = False
        #: The broker answered FetchStream with UNIMPLEMENTED: use unary Fetch.
        self._unary = False

        self.high_watermark = -1
        self.log_start_offset = 0
        #: Fetch answers received (each answer of a continuous fetch counts).
        self.fetches = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"feed-{self.topic}-{self.partition}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        for attempt in range(STOP_ATTEMPTS):
            if task is None or task.done():
                break
            # Again if a cancellation was lost (an await completing in the same loop turn can drop one):
            # a dropped subscription must never wait on its feed for ever (a new Subscribe waits on it).
            task.cancel()
            await asyncio.wait({task}, timeout=STOP_WAIT_S)
            if not task.done():
                log.warning("feed %s/%d did not stop (attempt %d)", self.topic, self.partition, attempt + 1)
        self._close_call()
        self._close_follower()

    # ---- what subscriptions call ----------------------------------------------------------------

    def kick(self) -> None:
        """Something changed (a subscription joined, read-ahead room freed): look again. Reading that
        is paused, or that goes on beyond where it must now start, is steered right away."""
        self._kick.set()
        if self._follower is not None:
            if not self._delivering:
                self._steer()
        elif self._fetch_offset >= 0:
            new = self._wanted_offset()
            if new is not None and new < self._fetch_offset:
                self._cancel_fetch()

    def room(self, position: int) -> None:
        """A subscription at ``position`` has read-ahead room (it dispatched messages). Act only
        when that matters: the feed is idle or paused, or it reads beyond ``position``."""
        if self._follower is not None:
            if self._delivering:
                return  # the answer being delivered is followed by a look at every subscription
            if position < self._following:
                self._restart()
            elif self._follower.paused:
                self._steer()
            return
        fetching = self._fetch_offset
        if fetching < 0:
            self._kick.set()
        elif position < fetching:
            self._cancel_fetch()

    def _wanted_offset(self) -> int | None:
        p = self.partition
        positions = [pos for t in self._targets() if t.wants(p) and (pos := t.read_position(p)) is not None]
        return min(positions) if positions else None

    # ---- the feed task --------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            self._kick.clear()
            seen = self._link.routing.generation
            try:
                busy = await self._step()
            except Exception as exc:
                self._close_follower()
                if isinstance(exc, SluiceError | grpc.RpcError):
                    log.warning("fetch %s/%d at %d: %s", self.topic, self.partition, self._offset, exc)
                else:  # a bug: say so loudly, and keep the feed alive (a dead feed delivers nothing)
                    log.exception("fetch %s/%d at %d failed", self.topic, self.partition, self._offset)
                    self._close_call()
                await asyncio.sleep(self._backoff.next())
                # Once per burst: when every feed of a dead broker fails at once, one of them refreshes.
                with contextlib.suppress(SluiceError, grpc.RpcError):
                    await self._link.routing.refresh_after(seen)
                continue
            if not busy:
                await self._kick.wait()

    async def _step(self) -> bool:
        """Do what the feed needs now; False when nothing more until a kick (or a follower's news)."""
        failure = self._failure
        if failure is not None:
            self._failure = None
            raise failure
        if self._out_of_range_at >= 0:
            self._offset, self._out_of_range_at = self._out_of_range_at, -1
            await self._out_of_range(self._offset)
            return True
        wanted = self._wanted_offset()
        if wanted is None:
            if self._follower is not None:
                self._follower.pause()
            return False
        offset = wanted
        self._offset = offset
        if self.epochs.stale(self._link.view.leader_epoch(self.topic, self.partition)):
            self._close_follower()  # nothing more is read before the position is checked (KIP-320)
            end = await self.epochs.check(self._link, self._channels)
            if end is not None:
                for t in self._targets():
                    t.truncated(self.partition, end)
            return True
        broker = self._link.broker_for(self.topic, self.partition)
        wire = self._link.wire_for(broker)
        if wire is None:  # no wire port (any more): gRPC
            self._close_follower()
            resp = await self._fetch(broker, offset)
            self._backoff.reset()
            if resp is not None:
                self._deliver(offset, resp)
            return True
        self._close_call()  # the broker gained a wire port
        follower = self._follower
        if follower is not None and (self._follow_broker != broker or follower.address != wire):
            self._close_follower()  # moved
            follower = None
        if follower is None:
            await self._open_follower(broker, wire, offset)
            return True  # and look again: things may have changed while it connected
        self._steer()
        return False

    # ---- the wire -------------------------------------------------------------------------------

    async def _open_follower(self, broker: str, wire: str, offset: int) -> None:
        follower = self._follower = FetchFollower(
            wire,
            self._request(offset),
            self._on_answer,
            self._on_follow_error,
            self._max_wait_ms / 1000 + FETCH_GRACE,
            f"dispatcher-{self._link.dispatcher_id}",
        )
        self._following = offset
        self._follow_broker = broker
        self._follow_view = self._link.view
        try:
            await follower.open()
        except BaseException:
            if self._follower is follower:
                self._close_follower()
            raise

    def _close_follower(self) -> None:
        follower = self._follower
        if follower is not None:
            self._follower = None
            self._following = -1
            follower.close()

    def _restart(self) -> None:
        """Read from elsewhere: a new follower, opened by the task where reading must start."""
        self._close_follower()
        self._kick.set()

    def _steer(self) -> None:
        """Keep the follower reading where the feed must read: paused while nobody wants records,
        restarted when the lowest wanting subscription is not where its next answer starts."""
        follower = self._follower
        if follower is None:
            return
        wanted = self._wanted_offset()
        if wanted is None:
            follower.pause()
        elif wanted != self._following:
            self._restart()
        elif follower.paused:
            follower.resume()

    def _on_follow_error(self, err: Exception) -> None:
        """The follower failed: the task logs it, backs off and opens another."""
        if self._following >= 0:
            self._offset = self._following
        self._close_follower()
        self._failure = err
        self._kick.set()

    def _on_answer(self, resp: broker_pb2.FetchResponse) -> None:
        """One answer of the continuous fetch, in the follower's read callback: what the task would
        do with a fetched answer, without the task."""
        self.fetches += 1
        start = self._following
        error = error_from_proto(resp.error)
        if error is not None:
            self._on_follow_error(error)
            return
        part = resp.partitions[0]
        error = error_from_proto(part.error)
        if isinstance(error, OffsetOutOfRange):  # the broker has stopped following too
            self._close_follower()
            self._out_of_range_at = start  # asks the broker for the log start: the task's job
            self._kick.set()
            return
        if error is not None:
            self._on_follow_error(error)
            return
        self.high_watermark = part.high_watermark
        self.log_start_offset = part.log_start_offset
        self._following = part.next_offset
        self._backoff.reset()
        self._delivering = True
        try:
            self._deliver(start, part)
        finally:
            self._delivering = False
        if self._link.view is not self._follow_view and self._moved():
            self._restart()
        else:
            self._steer()

    def _moved(self) -> bool:
        """Whether the metadata now puts the partition (or its broker's wire port) elsewhere. Asked only
        when the metadata was refreshed since the follower last looked: a refresh replaces the view."""
        self._follow_view = self._link.view
        try:
            broker = self._link.broker_for(self.topic, self.partition)
        except SluiceError:
            return True  # the task says why
        follower = self._follower
        return (
            follower is None
            or broker != self._follow_broker
            or self._link.wire_for(broker) != follower.address
            or self.epochs.stale(self._link.view.leader_epoch(self.topic, self.partition))
        )

    def _request(self, offset: int) -> broker_pb2.FetchRequest:
        return broker_pb2.FetchRequest(
            max_wait_ms=self._max_wait_ms,
            min_bytes=1,
            max_bytes=self._max_bytes,
            session_epoch=-1,
            partitions=[
                broker_pb2.FetchPartition(
                    topic=self.topic,
                    partition=self.partition,
                    fetch_offset=offset,
                    partition_max_bytes=self._max_bytes,
                    # KIP-320: a broker that is not the leader in this epoch answers FENCED_ or
                    # UNKNOWN_LEADER_EPOCH, and the task refreshes the metadata and reads again.
                    current_leader_epoch=self._link.view.leader_epoch(self.topic, self.partition),
                )
            ],
            client_id=f"dispatcher-{self._link.dispatcher_id}",
        )

    # ---- gRPC -----------------------------------------------------------------------------------

    def _close_call(self) -> None:
        if self._call is not None:
            self._call.close()
            self._call = None

    def _send(
        self, broker: str, request: broker_pb2.FetchRequest
    ) -> asyncio.Future[broker_pb2.FetchResponse]:
        """Start one fetch on this feed's FetchStream call to ``broker`` (opened when missing or
        elsewhere), or a unary Fetch."""
        if self._call is not None and self._call_broker != broker:
            self._close_call()
        stub = self._channels.broker(broker)
        if self._unary:
            return asyncio.ensure_future(stub.Fetch(request, timeout=self._max_wait_ms / 1000 + FETCH_GRACE))
        if self._call is None:
            self._call = FetchCall(broker, stub)
            self._call_broker = broker
        return asyncio.ensure_future(self._call.fetch(request))

    def _cancel_fetch(self) -> None:
        f = self._fetching
        if f is not None and not f.done():
            self._fetch_cancelled = True
            f.cancel()

    async def _fetch(self, broker: str, offset: int) -> broker_pb2.FetchPartitionResponse | None:
        """One fetch over gRPC; None when a kick made it pointless (it was cancelled)."""
        request = self._request(offset)
        self._kick.clear()
        self._fetch_offset = offset
        self._fetch_cancelled = False
        # One future per fetch, cancelled directly by kick()/room() when it no longer starts at the
        # right place: no second task per fetch to watch for kicks.
        fetching = self._fetching = self._send(broker, request)
        try:
            # Not wait_for: on 3.11 it drops the task's own cancellation when the fetch completes then.
            async with asyncio.timeout(self._max_wait_ms / 1000 + FETCH_GRACE):
                resp = await fetching
        except asyncio.CancelledError:
            self._close_call()
            if self._fetch_cancelled and not current_task_cancelling():
                return None
            raise
        except TimeoutError:
            self._close_call()
            raise BrokerNotAvailable(f"broker {broker} did not answer a fetch in time") from None
        except SluiceError:
            self._close_call()
            raise
        except grpc.RpcError as exc:
            self._close_call()
            if not self._unary and is_unimplemented(exc):
                log.info("broker %s has no FetchStream: using unary Fetch", broker)
                self._unary = True
            raise error_from_rpc(exc) from None
        finally:
            self._fetch_offset = -1
            self._fetching = None
        self.fetches += 1
        error = error_from_proto(resp.error)
        if error is not None:
            self._close_call()
            raise error
        part = resp.partitions[0]
        error = error_from_proto(part.error)
        if isinstance(error, OffsetOutOfRange):
            await self._out_of_range(offset)
            return None
        if error is not None:
            raise error
        self.high_watermark = part.high_watermark
        self.log_start_offset = part.log_start_offset
        return part

    # ---- both -----------------------------------------------------------------------------------

    async def _out_of_range(self, offset: int) -> None:
        """The log no longer starts where subscriptions are (retention): move them to the log start."""
        start = (await self._link.list_offsets(self.topic, [self.partition], EARLIEST))[self.partition]
        if offset < start:
            log.warning(
                "%s/%d: offset %d is below the log start %d; skipping ahead",
                self.topic,
                self.partition,
                offset,
                start,
            )
            for t in self._targets():
                t.skip_to(self.partition, start)
        else:
            raise OffsetOutOfRange(f"{self.topic}/{self.partition}: offset {offset} is beyond the log end")

    def _deliver(self, offset: int, part: broker_pb2.FetchPartitionResponse) -> None:
        next_offset = part.next_offset
        if next_offset <= offset:
            return
        views = batch_views(part.records) if part.records else []
        self.epochs.saw(views, next_offset)
        messages = messages_of(views, self.partition, offset) if views else []
        for t in self._targets():
            pos = t.read_position(self.partition)
            if pos is not None and offset <= pos < next_offset and t.within_budget():
                t.offer(self.partition, messages, offset, next_offset)
