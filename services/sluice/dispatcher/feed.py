"""One long-poll fetch loop per partition with active subscriptions.

The feed asks the partition's broker for records from the lowest read position among the
subscriptions that have read-ahead room, indexes each fetched batch once (``batch_views``: header,
columns, offsets; CRC checked, no record decoded) with one ``Message`` per record pointing into it
(``messages_of``), and offers the same message objects to every subscription whose read position falls
inside what was fetched. A subscription that is full (read-ahead bytes reached) is left
behind and caught up by a later fetch from its own position; the fetch never waits for it.

While every subscription is caught up the fetch parks on the broker (``max_wait_ms``) and returns as soon
as records are appended, which is what keeps end-to-end latency low. A subscription joining at an
earlier position ``kick``s the feed, which cancels a parked fetch that no longer starts at the right
place; a subscription that dispatched messages tells the feed it has ``room`` again, which kicks only an
idle feed or one whose parked fetch starts beyond that subscription's position.

Fetches travel on a connection kept open per feed, one request at a time (as a long-poll must be):
the broker's wire port (``docs/wire.md``) when it advertises one, else a ``Broker.FetchStream`` call.
On the wire the fetch is continuous: the broker fetches again from each answer's end by itself,
so a feed that keeps up sends one request and then only reads answers; a feed that must read from
elsewhere (a kick, a subscription behind) starts over on a new connection.
Per message the wire costs both sides a fraction of what a gRPC stream does, and a stream message a
fraction of a unary call, which is what latency at a steady rate depends on. Cancelling a parked fetch
(a kick) closes the connection; the next fetch opens a new one. A broker without FetchStream
(``UNIMPLEMENTED``) is asked with unary ``Fetch`` from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

import grpc
from grpc import aio

from sluice.codec.batch import batch_views
from sluice.common.rpc import error_from_rpc
from sluice.common.wire import FrameType
from sluice.common.wire_aio import AsyncWireConnection
from sluice.dispatcher.cluster import ChannelCache, CoordinatorLink, list_offsets_request
from sluice.dispatcher.messages import Message, messages_of
from sluice.errors import BrokerNotAvailable, OffsetOutOfRange, SluiceError, error_for_code
from sluice.v1 import broker_pb2, broker_pb2_grpc, common_pb2

log = logging.getLogger(__name__)

__all__ = ["FeedTarget", "PartitionFeed"]

#: Seconds a fetch may take beyond its max_wait before the broker is considered hung.
FETCH_GRACE = 10.0


def _current_task_cancelling() -> bool:
    """Whether the running task itself is being cancelled (the feed stops), not just a fetch."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class FeedTarget(Protocol):
    """A subscription as its feed sees it (``service.SubscriptionRuntime``)."""

    def read_position(self, partition: int) -> int | None: ...
    def wants(self, partition: int) -> bool: ...
    def offer(self, partition: int, messages: list[Message], start: int, next_offset: int) -> None: ...
    def skip_to(self, partition: int, position: int) -> None: ...


_WireFetch = AsyncWireConnection[broker_pb2.FetchRequest, broker_pb2.FetchResponse]


class _FetchCall:
    """One open ``FetchStream`` to one broker: a request, then its answer, one at a time."""

    def __init__(self, broker: str, stub: broker_pb2_grpc.BrokerAsyncStub) -> None:
        self.broker = broker
        # No request iterator: requests are written with call.write() (grpc.aio allows it; the
        # stubs do not say so).
        self.call = stub.FetchStream()  # type: ignore[call-arg]

    async def fetch(self, request: broker_pb2.FetchRequest) -> broker_pb2.FetchResponse:
        await self.call.write(request)
        resp = await self.call.read()
        if not isinstance(resp, broker_pb2.FetchResponse):  # grpc.aio.EOF: the broker ended the call
            raise BrokerNotAvailable(f"broker {self.broker} ended the fetch stream")
        return resp

    def close(self) -> None:
        self.call.cancel()


class PartitionFeed:
    def __init__(
        self,
        topic: str,
        partition: int,
        link: CoordinatorLink,
        channels: ChannelCache,
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
        self._kick = asyncio.Event()
        self._fetch_offset = -1
        #: The connection fetches travel on, and the broker (gRPC address) it leads to.
        self._call: _FetchCall | _WireFetch | None = None
        self._call_broker = ""
        #: On a wire connection: the offset the broker's continuous fetch reads from next, or -1.
        self._following = -1
        #: The fetch in flight, and whether kick()/room() cancelled it (a wasted long-poll).
        self._fetching: asyncio.Future[broker_pb2.FetchResponse] | None = None
        self._fetch_cancelled = False
        #: The broker answered FetchStream with UNIMPLEMENTED: use unary Fetch.
        self._unary = False
        self.high_watermark = -1
        self.log_start_offset = 0
        self.fetches = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"feed-{self.topic}-{self.partition}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._close_call()

    def _close_call(self) -> None:
        self._following = -1
        if self._call is not None:
            self._call.close()
            self._call = None

    def _send(
        self, broker: str, request: broker_pb2.FetchRequest
    ) -> asyncio.Future[broker_pb2.FetchResponse]:
        """Start one fetch on this feed's connection to ``broker`` (opened when missing or elsewhere):
        the broker's wire port when it serves one, else a FetchStream call."""
        if self._call is not None and self._call_broker != broker:
            self._close_call()
        wire = self._link.wire_for(broker)
        if wire is not None:
            if self._call is None:
                self._call = AsyncWireConnection(
                    wire, FrameType.FETCH, broker_pb2.FetchResponse, f"dispatcher-{self._link.dispatcher_id}"
                )
                self._call_broker = broker
            if isinstance(self._call, AsyncWireConnection):
                offset = request.partitions[0].fetch_offset
                if self._following == offset:
                    # The broker is already fetching from here (continuous): read its next answer.
                    return asyncio.ensure_future(self._call.answer())
                if self._following >= 0:  # following from elsewhere: start over on a new connection
                    self._close_call()
                    return self._send(broker, request)
                request.continuous = True
                self._following = offset
                return asyncio.ensure_future(self._call.request(request))
            self._close_call()  # the broker gained a wire port since this call opened
        stub = broker_pb2_grpc.BrokerStub(self._channels.get(broker))
        if self._unary:
            return asyncio.ensure_future(stub.Fetch(request, timeout=self._max_wait_ms / 1000 + FETCH_GRACE))
        if self._call is None:
            self._call = _FetchCall(broker, stub)
            self._call_broker = broker
        assert isinstance(self._call, _FetchCall)
        return asyncio.ensure_future(self._call.fetch(request))

    def kick(self) -> None:
        """Something changed (a subscription joined, read-ahead room freed): look again. A parked
        fetch that starts beyond where reading must now start is cancelled."""
        self._kick.set()
        if self._fetch_offset >= 0:
            new = self._wanted_offset()
            if new is not None and new < self._fetch_offset:
                self._cancel_fetch()

    def room(self, position: int) -> None:
        """A subscription at ``position`` has read-ahead room (it dispatched messages). Act only
        when that matters: the feed is idle, or its parked fetch starts beyond ``position``. Waking
        the parked fetch on every dispatch (thousands of times a second at a steady rate) cost
        dispatcher CPU for nothing."""
        fetching = self._fetch_offset
        if fetching < 0:
            self._kick.set()
        elif position < fetching:
            self._cancel_fetch()

    def _cancel_fetch(self) -> None:
        f = self._fetching
        if f is not None and not f.done():
            self._fetch_cancelled = True
            f.cancel()

    def _wanted_offset(self) -> int | None:
        p = self.partition
        positions = [pos for t in self._targets() if t.wants(p) and (pos := t.read_position(p)) is not None]
        return min(positions) if positions else None

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            offset = self._wanted_offset()
            if offset is None:
                self._kick.clear()
                if self._wanted_offset() is None:
                    await self._kick.wait()
                continue
            try:
                resp = await self._fetch(offset)
            except Exception as exc:
                if isinstance(exc, SluiceError | grpc.RpcError):
                    log.warning("fetch %s/%d at %d: %s", self.topic, self.partition, offset, exc)
                else:  # a bug: say so loudly, and keep the feed alive (a dead feed delivers nothing)
                    log.exception("fetch %s/%d at %d failed", self.topic, self.partition, offset)
                    self._close_call()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                with contextlib.suppress(SluiceError, grpc.RpcError):
                    await self._link.refresh()
                continue
            backoff = 0.05
            if resp is not None:
                self._deliver(offset, resp)

    async def _fetch(self, offset: int) -> broker_pb2.FetchPartitionResponse | None:
        """One fetch; None when a kick made it pointless (it was cancelled)."""
        broker = self._link.broker_for(self.topic, self.partition)
        request = broker_pb2.FetchRequest(
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
                )
            ],
            client_id=f"dispatcher-{self._link.dispatcher_id}",
        )
        self._kick.clear()
        self._fetch_offset = offset
        self._fetch_cancelled = False
        # One future per fetch, cancelled directly by kick()/room() when it no longer starts at the
        # right place: no second task per fetch to watch for kicks.
        fetching = self._fetching = self._send(broker, request)
        try:
            resp = await asyncio.wait_for(fetching, self._max_wait_ms / 1000 + FETCH_GRACE)
        except asyncio.CancelledError:
            self._close_call()
            if self._fetch_cancelled and not _current_task_cancelling():
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
            if (
                not self._unary
                and isinstance(exc, aio.AioRpcError)
                and exc.code() == grpc.StatusCode.UNIMPLEMENTED
            ):
                log.info("broker %s has no FetchStream: using unary Fetch", broker)
                self._unary = True
            raise error_from_rpc(exc) from None
        finally:
            self._fetch_offset = -1
            self._fetching = None
        self.fetches += 1
        if resp.error.code != common_pb2.NONE:
            self._close_call()
            raise error_for_code(resp.error.code, resp.error.message)
        part = resp.partitions[0]
        if self._following >= 0:
            # The broker goes on from this answer's end, unless the partition failed.
            self._following = part.next_offset if part.error.code == common_pb2.NONE else -1
        if part.error.code == common_pb2.OFFSET_OUT_OF_RANGE:
            await self._out_of_range(offset)
            return None
        if part.error.code != common_pb2.NONE:
            raise error_for_code(part.error.code, part.error.message)
        self.high_watermark = part.high_watermark
        self.log_start_offset = part.log_start_offset
        return part

    async def _out_of_range(self, offset: int) -> None:
        """The log no longer starts where subscriptions are (retention): move them to the log start."""
        broker = self._link.broker_for(self.topic, self.partition)
        stub = broker_pb2_grpc.BrokerStub(self._channels.get(broker))
        resp = await stub.ListOffsets(list_offsets_request(self.topic, [self.partition], -2), timeout=10)
        start = resp.partitions[0].offset
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
        messages = messages_of(batch_views(part.records), self.partition, offset) if part.records else []
        for t in self._targets():
            pos = t.read_position(self.partition)
            if pos is not None and offset <= pos < next_offset:
                t.offer(self.partition, messages, offset, next_offset)
