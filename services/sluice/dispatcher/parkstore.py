"""The parking store of a push subscription: ``<topic>.<subscription>.PARK`` (docs/poison-keys.md).

One partition, written as the event log the pull side writes (``retry.parkbook``: ``park``, ``fail``,
``resolved``, ``unpark``, each with its source coordinates) and replayed with the same ``ParkBook``.
``parking.py`` decides what to write (``Effects.park_events``); this module appends the events in
order, one produce in flight per subscription (``acks=-1``), and only once the broker acknowledged a
``park`` does the subscription acknowledge that message on its cursor (``Subscription.parks_saved``).
A failed write is retried, in order, with a backoff (nothing is acknowledged meanwhile, so nothing is
lost: the message stays unacknowledged on the cursor and is read again after a crash). A ``kill -9``
anywhere costs at most a repeated write, which the replay drops by source (``ParkBook.add``) and
``parkrestore.restore`` acknowledges on the cursor.

The topic is created on the first write (like the DLQ's) and read at load (``restore``) from its log
start to its end, before the subscription's feeds read anything. A non-durable subscription has no store
(it does not outlive its consumers, nor its dispatcher): its parks count as saved at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable

import grpc

from sluice.codec.batch import BatchBuilder, Record, batch_views
from sluice.common.list_offsets import EARLIEST, LATEST
from sluice.common.peers import AioPeers
from sluice.common.rpc import error_from_rpc
from sluice.common.timeouts import within
from sluice.dispatcher.cluster import CoordinatorLink
from sluice.dispatcher.model import ParkEvent
from sluice.errors import SluiceError, UnknownTopicOrPartition, raise_for_proto
from sluice.retry.levels import source_key
from sluice.retry.parkbook import H_HOW, H_OP, H_PCOUNT, H_PDUE, H_PSOURCE, ParkBook, sub_park_topic
from sluice.v1 import broker_pb2

log = logging.getLogger(__name__)

__all__ = ["ParkStore", "event_record", "replay"]

RPC_TIMEOUT = 10.0
#: Events per produce (a parked message is one event of its own size).
MAX_EVENTS = 1000
MAX_BYTES = 4 * 1024 * 1024
FETCH_BYTES = 4 * 1024 * 1024


def event_record(topic: str, e: ParkEvent, wall_ms: int) -> Record:
    """``e`` as the record the store holds (``retry.parkbook``'s event format). A parked message keeps
    its key, value, tag and headers; its timestamp becomes the time it was parked (the key's age)."""
    src = source_key(topic, e.partition, e.offset).encode()
    if e.op == "park":
        assert e.message is not None
        r = e.message.record
        headers = {**r.headers, H_OP: b"park", H_PSOURCE: src}
        if e.count:
            headers[H_PCOUNT] = str(e.count).encode()
            headers[H_PDUE] = b"0"
        return Record("", 0, -1, e.key, r.value, r.tag, headers, wall_ms)
    if e.op == "fail":
        headers = {H_OP: b"fail", H_PSOURCE: src, H_PCOUNT: str(e.count).encode(), H_PDUE: b"0"}
    elif e.op == "resolved":
        headers = {H_OP: b"resolved", H_PSOURCE: src, H_HOW: e.how.encode()}
    else:  # unpark: every partition of the key
        headers = {H_OP: b"unpark"}
    return Record("", 0, -1, e.key, b"", None, headers, wall_ms)


class ParkStore:
    """The store of one loaded subscription. Caller: ``SubscriptionRuntime``."""

    def __init__(
        self,
        topic: str,
        subscription: str,
        link: CoordinatorLink,
        channels: AioPeers,
        saved: Callable[[dict[int, list[int]]], None],
        durable: bool = True,
    ) -> None:
        self.topic = topic
        self.name = sub_park_topic(topic, subscription)
        self._link = link
        self._channels = channels
        #: Called with {partition: offsets} of the ``park`` events the broker acknowledged.
        self._saved = saved
        self._queue: list[ParkEvent] = []
        self._task: asyncio.Task[None] | None = None
        self._ensured = False
        self.durable = durable
        self.closed = False

    # ---- writing ----------------------------------------------------------------------------------

    def write(self, events: list[ParkEvent]) -> None:
        """Append ``events`` after everything queued (in order, in the background)."""
        if not self.durable:
            saved = _parked(events)
            if saved:
                asyncio.get_running_loop().call_soon(self._saved, saved)
            return
        self._queue += events
        if not self.closed and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._run(), name=f"park-{self.name}")

    async def _run(self) -> None:
        delay = 0.2
        while self._queue and not self.closed:
            batch = _chunk(self._queue)
            try:
                await self._append(batch)
            except (SluiceError, OSError) as exc:
                log.warning("parking %d events in %s failed: %s", len(batch), self.name, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.2
            del self._queue[: len(batch)]
            saved = _parked(batch)
            if saved:
                self._saved(saved)

    async def _append(self, events: list[ParkEvent]) -> None:
        if not self._ensured:
            await self._link.ensure_topic(self.name)
            self._ensured = True
        builder = BatchBuilder()
        now = int(time.time() * 1000)
        for e in events:
            r = event_record(self.topic, e, now)
            builder.append(r.value, r.key, r.tag, r.headers, r.timestamp)
        stub = self._channels.broker(await self._leader())
        try:
            resp = await stub.Produce(
                broker_pb2.ProduceRequest(
                    acks=-1,
                    timeout_ms=int(RPC_TIMEOUT * 1000),
                    partitions=[
                        broker_pb2.ProducePartition(topic=self.name, partition=0, records=builder.build())
                    ],
                ),
                timeout=RPC_TIMEOUT,
            )
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        for part in resp.partitions:
            raise_for_proto(part.error)

    async def _leader(self) -> str:
        route = self._link.view.route(self.name, 0)
        if route is None or not route.broker:
            route = (await self._link.refresh()).route(self.name, 0)
        if route is None or not route.broker:
            raise UnknownTopicOrPartition(f"no leader known for {self.name}/0")
        return route.broker

    async def close(self, drain_s: float) -> None:
        """Write what is queued (bounded by ``drain_s`` seconds), then stop: an unload loses no event it can
        still write (what it cannot is written again, or re-read from the log, after the restart)."""
        task = self._task
        if task is not None and not task.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await within(asyncio.shield(task), drain_s)
        self.closed = True
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ---- replay -----------------------------------------------------------------------------------

    async def replay(self) -> ParkBook:
        """The store's state: its events from the log start to the end (an empty book if the topic does
        not exist: nothing was ever parked)."""
        return await replay(self._link, self._channels, self.name)


async def replay(link: CoordinatorLink, channels: AioPeers, name: str) -> ParkBook:
    """Replay the parking topic ``name`` into a ``ParkBook`` (``sluice subscription parked`` of a
    subscription not loaded here reads it too)."""
    book = ParkBook()
    try:
        await link.topic(name, fresh=True)
    except UnknownTopicOrPartition:
        return book
    start = (await link.list_offsets(name, [0], EARLIEST))[0]
    end = (await link.list_offsets(name, [0], LATEST))[0]
    position = start
    deadline = time.monotonic() + 6 * RPC_TIMEOUT
    while position < end:
        if time.monotonic() > deadline:
            raise UnknownTopicOrPartition(f"replaying {name} {position}..{end} took too long")
        stub = channels.broker(link.broker_for(name, 0))
        try:
            resp = await stub.Fetch(
                broker_pb2.FetchRequest(
                    # Answered at once while records are there; an answer with none (a leader moving
                    # under the replay) waits on the broker instead of this loop asking again at once.
                    max_wait_ms=500,
                    min_bytes=1,
                    max_bytes=FETCH_BYTES,
                    session_epoch=-1,
                    partitions=[
                        broker_pb2.FetchPartition(
                            topic=name, partition=0, fetch_offset=position, partition_max_bytes=FETCH_BYTES
                        )
                    ],
                ),
                timeout=RPC_TIMEOUT,
            )
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        raise_for_proto(resp.error)
        part = resp.partitions[0]
        raise_for_proto(part.error)
        for view in batch_views(part.records) if part.records else []:
            for i, offset in enumerate(view.offsets):
                if offset >= position:
                    book.apply(view.record(name, 0, i))
        position = max(position, part.next_offset)
    return book


def _parked(events: list[ParkEvent]) -> dict[int, list[int]]:
    """{partition: offsets} of the ``park`` events."""
    saved: dict[int, list[int]] = defaultdict(list)
    for e in events:
        if e.op == "park":
            saved[e.partition].append(e.offset)
    return dict(saved)


def _chunk(queue: list[ParkEvent]) -> list[ParkEvent]:
    """The first events of ``queue`` for one produce (at least one)."""
    size = 0
    for i, e in enumerate(queue[:MAX_EVENTS]):
        size += e.message.size if e.message is not None else 64
        if size > MAX_BYTES and i:
            return queue[:i]
    return queue[:MAX_EVENTS]
