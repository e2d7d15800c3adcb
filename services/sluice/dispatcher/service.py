"""The dispatcher's core: the one implementation of subscribe, flow, ack and nack, plus routing,
subscription loading, feeds, cursor flushes and routing changes (docs/architecture.md).

It works on domain values only (``requests.py`` in, ``ConsumerStream`` calls out): each operation
takes the caller's ``RequestContext``, validates, asks the authorizer, executes and raises a typed
``SluiceError``. Everything runs on one asyncio loop; the state machines are synchronous, so no locks
guard them. Callers: ``servicer.DispatcherServicer`` (both transports) and ``main`` (start/stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from sluice.common.memory import trim_loop
from sluice.common.peers import AioPeers
from sluice.common.timeouts import within
from sluice.dispatcher.ack_epochs import Claim, refuse_stale, unknown_ids
from sluice.dispatcher.budget import MemoryBudget
from sluice.dispatcher.cluster import ClusterView, CoordinatorLink
from sluice.dispatcher.config import DispatcherConfig
from sluice.dispatcher.consumer import ConsumerSpec
from sluice.dispatcher.cursor import PartitionCursor
from sluice.dispatcher.cursor_store import CursorStore, DirtyCursor
from sluice.dispatcher.describe import SubscriptionViews
from sluice.dispatcher.dlq import DeadLetterSink
from sluice.dispatcher.epoch_check import check_loaded
from sluice.dispatcher.feedset import FeedSet
from sluice.dispatcher.metrics import DispatcherMetrics
from sluice.dispatcher.model import SubscriptionSettings
from sluice.dispatcher.parkadmin import ParkedKeysAdmin
from sluice.dispatcher.registry import SubscriptionBook, check_room, wall_ms
from sluice.dispatcher.requests import InitialPosition, SubscribeRequest, ack_offsets, consumer_spec
from sluice.dispatcher.runtime import ConsumerStream, SubscriptionRuntime
from sluice.dispatcher.subadmin import SubscriptionAdmin
from sluice.errors import (
    BrokerNotAvailable,
    InvalidPermits,
    NotDispatcher,
    ProtocolViolation,
    SluiceError,
    UnknownTopicOrPartition,
)
from sluice.quotas.model import Resource as QuotaResource
from sluice.quotas.throttle import QuotaManager, admit
from sluice.security.context import AllowAll, Authorizer, Operation, RequestContext
from sluice.security.model import Resource, ResourceType

log = logging.getLogger(__name__)

__all__ = ["DispatcherService"]

SubKey = tuple[str, str]


class DispatcherService:
    def __init__(
        self, config: DispatcherConfig, metrics: DispatcherMetrics, authorizer: Authorizer | None = None
    ) -> None:
        self.config = config
        #: The authorization seam (``sluice.security.context``): asked once per Subscribe.
        self.authorizer: Authorizer = authorizer or AllowAll()
        #: Client quotas (the subscribe rate), kept current by main's QuotaPoller.
        self.quotas = QuotaManager()
        self.metrics = metrics
        self.dispatcher_id = config.resolved_id
        self.channels = AioPeers()
        self.link = CoordinatorLink(
            config.coordinator,
            self.dispatcher_id,
            self.channels,
            config.metadata_refresh_interval.total_seconds(),
            self._on_view,
        )
        #: What subscriptions may hold, in bytes (``budget.py``): reading pauses at the limit.
        self.budget = MemoryBudget(config.memory_budget_bytes, config.subscription_memory_bytes)
        self.store = CursorStore(self.channels.offset_store)
        self.dlq = DeadLetterSink(self.link, self.channels)
        self.book = SubscriptionBook(self)
        self.admin = SubscriptionAdmin(self, self.book)
        self.runtimes: dict[SubKey, SubscriptionRuntime] = {}
        self.feedset = FeedSet(config, self.link, self.channels)
        self.feeds = self.feedset.feeds
        self._save_lock = asyncio.Lock()
        self._flush_wanted = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._loop = asyncio.get_running_loop()
        self.views = SubscriptionViews(self, self.book)
        self.parked = ParkedKeysAdmin(self, self.admin.locked)
        metrics.state.source = self.views.gauge_rows
        metrics.state.budget = self.budget

    def now_ms(self) -> int:
        return int(self._loop.time() * 1000)

    # ---- lifecycle -------------------------------------------------------------------------------------

    def start(self, host: str, port: int, wire_port: int = 0) -> None:
        self._tasks.append(asyncio.create_task(self.link.run(host, port, wire_port), name="coordinator-link"))
        self._tasks.append(asyncio.create_task(self._flush_loop(), name="cursor-flush"))
        self._tasks.append(asyncio.create_task(self._book_loop(), name="subscription-book"))
        # What bursts of subscriptions free goes back to the system (common/memory.py).
        self._tasks.append(asyncio.create_task(trim_loop(), name="heap-trim"))

    async def stop(self) -> None:
        """Graceful stop: end every stream, persist every cursor, stop feeds."""
        for rt in list(self.runtimes.values()):
            for stream in list(rt.streams.values()):
                stream.close()
            await self.drop(rt)
        await self.book.flush_touches()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
        await self.channels.close()

    # ---- subscribe -------------------------------------------------------------------------------------

    async def subscribe(self, ctx: RequestContext, stream: ConsumerStream, req: SubscribeRequest) -> None:
        """Attach ``stream`` as a consumer; raises the typed error (the servicer reports it)."""
        spec, settings = consumer_spec(req, self.config)
        # The dispatcher reads from the brokers as the cluster, so it checks the subscriber's own
        # rights here, before anything is delivered (no confused deputy, docs/security.md).
        self.authorizer.authorize(ctx, Operation.READ, Resource(ResourceType.TOPIC, req.topic))
        self.authorizer.authorize(ctx, Operation.READ, Resource(ResourceType.SUBSCRIPTION, req.subscription))
        await admit(self.quotas, ctx, QuotaResource.SUBSCRIBES)  # the subscribe-rate quota (docs/quotas.md)
        try:
            await within(self.link.registered.wait(), 10)
        except TimeoutError:
            raise BrokerNotAvailable("the dispatcher is not registered with the coordinator yet") from None
        desc = await self.link.topic(req.topic, fresh=True)
        count = len(desc.partitions)
        wanted = sorted(set(req.partitions)) if req.partitions else list(range(count))
        if wanted and wanted[-1] >= count:
            raise UnknownTopicOrPartition(f"topic {req.topic!r} has {count} partitions, not {wanted[-1] + 1}")
        view = self.link.view
        for attempt in range(2):
            mine = set(view.partitions_of(req.topic, self.dispatcher_id))
            foreign = [p for p in wanted if p not in mine]
            if req.partitions and not foreign:
                break
            if not req.partitions and mine:
                break
            if attempt == 0:
                view = await self.link.refresh()
        else:
            raise view.not_dispatcher(req.topic, foreign or wanted)
        # The admin lock: a reset, skip or delete of this subscription never sees it half joined.
        async with self.admin.locked(req.topic, req.subscription):
            check_room(self.runtimes, self.book, (req.topic, req.subscription), spec.consumer_id, self.config)
            rt = await self._runtime(req, settings, sorted(mine), desc.topic_id)
            consumer, fx = rt.machine.add_consumer(spec, settings, self.now_ms())
        if rt.linger is not None:
            rt.linger.cancel()
            rt.linger = None
        rt.last_active_ms = 0
        self.book.touch(rt)
        old = rt.streams.get(spec.consumer_id)
        if old is not None and old is not stream:
            old.close()  # the same consumer reconnected: the old stream is over
        rt.streams[spec.consumer_id] = stream
        stream.runtime, stream.consumer = rt, consumer
        stream.record_batches = req.record_batches
        stream.subscribed(spec.consumer_id)
        rt.apply(fx)
        log.info(
            "consumer %s joined %s/%s (%s)",
            spec.consumer_id,
            req.topic,
            req.subscription,
            settings.type.label,
        )

    async def _runtime(
        self,
        req: SubscribeRequest,
        settings: SubscriptionSettings,
        partitions: list[int],
        topic_id: str,
    ) -> SubscriptionRuntime:
        key = (req.topic, req.subscription)
        rt: SubscriptionRuntime | None = None
        while True:
            rt = self.runtimes.get(key)
            if rt is not None and rt.closing:
                await rt.closed.wait()
                continue
            if rt is not None and not rt.machine.consumers and rt.durable != settings.durable:
                await self.drop(rt)  # an idle subscription changes durability: start over
                continue
            if rt is not None and rt.topic_id and topic_id and rt.topic_id != topic_id:
                # Still serving a deleted incarnation of the topic (the view change that ends it has
                # not arrived yet): end it now, and start this subscriber on the current topic.
                for stream in list(rt.streams.values()):
                    stream.fail(_topic_gone(rt))
                await self.drop(rt)
                continue
            break
        if rt is None:
            rt = SubscriptionRuntime(self, req.topic, req.subscription, settings)
            rt.topic_id = topic_id
            self.runtimes[key] = rt
            try:
                if rt.durable:
                    await self.book.register(rt)  # it lives until deleted: record it first
                await self._load(rt, req, partitions)
            except SluiceError as err:
                rt.load_error = err
                self.runtimes.pop(key, None)
                rt.closed.set()
                raise
            finally:
                rt.loaded.set()
        else:
            await rt.loaded.wait()
            if rt.load_error is not None:
                raise rt.load_error
        return rt

    async def _load(self, rt: SubscriptionRuntime, req: SubscribeRequest, partitions: list[int]) -> None:
        """Read the durable cursors (or resolve the initial position) and start the feeds."""
        cursors: dict[int, PartitionCursor] = {}
        if rt.durable:
            # Crash counts stop at today's log end (CursorStore.load).
            ends = await self.list_offsets(rt.topic, partitions, -1)
            loaded = await asyncio.gather(
                *(self.store.load(rt.topic, rt.name, p, ends[p]) for p in partitions)
            )
            cursors = {p: c for p, c in zip(partitions, loaded, strict=True) if c is not None}
            # KIP-320: a cursor read in an older leader epoch is checked with the leader before serving.
            for p, position, end in await check_loaded(self.link, self.channels, rt.topic, cursors):
                rt.count_truncation(p, position, end, "cursor_load")
        missing = [p for p in partitions if p not in cursors]
        if missing:
            starts = await self._initial_positions(rt.topic, missing, req)
            for p in missing:
                cur = PartitionCursor(p, mark_delete=starts[p], persisted=rt.durable)
                if rt.durable:
                    cur.version += 1  # a new durable cursor is persisted at its starting position
                cursors[p] = cur
        for p in partitions:
            rt.machine.attach_partition(cursors[p], cursors[p].mark_delete)
        if rt.machine.parking.on and rt.durable:  # Key_Shared parking: its store first (``parkstore.py``)
            await rt.restore_parking(consumer_spec(req, self.config)[0].max_redeliver)
        rt.call(rt.machine.activate)
        for p in partitions:
            self.feedset.attach(rt.topic, p, rt)

    async def _initial_positions(
        self, topic: str, partitions: list[int], req: SubscribeRequest
    ) -> dict[int, int]:
        earliest = await self.list_offsets(topic, partitions, -2)
        latest = await self.list_offsets(topic, partitions, -1)
        if req.initial_position == InitialPosition.OFFSET:
            return {p: min(max(req.initial_offset, earliest[p]), latest[p]) for p in partitions}
        return earliest if req.initial_position == InitialPosition.EARLIEST else latest

    async def list_offsets(self, topic: str, partitions: list[int], timestamp: int) -> dict[int, int]:
        """The peer layer's planner, routed by the link's view (``CoordinatorLink.list_offsets``)."""
        return await self.link.list_offsets(topic, partitions, timestamp)

    # ---- feeds -----------------------------------------------------------------------------------------

    def kick_feeds(self, rt: SubscriptionRuntime) -> None:
        """``rt`` dispatched messages: its partitions' feeds may read for it again."""
        for p in rt.machine.partitions:
            feed = self.feeds.get((rt.topic, p))
            position = rt.read_position(p)
            if feed is not None and position is not None and rt.wants(p):
                feed.room(position)

    # ---- commands on a subscribed stream ---------------------------------------------------------------

    @staticmethod
    def _attached(stream: ConsumerStream) -> tuple[SubscriptionRuntime, ConsumerSpec]:
        if stream.runtime is None or stream.consumer is None:
            raise ProtocolViolation("send Subscribe first")
        return stream.runtime, stream.consumer.spec

    def flow(self, ctx: RequestContext, stream: ConsumerStream, permits: int) -> None:
        rt, _ = self._attached(stream)
        if permits <= 0:
            raise InvalidPermits(f"Flow permits must be > 0, got {permits}")
        consumer = stream.consumer
        assert consumer is not None
        rt.apply(rt.machine.flow(consumer, permits, self.now_ms()))

    def ack(
        self,
        ctx: RequestContext,
        stream: ConsumerStream,
        ids: dict[int, list[int]],
        ranges: list[tuple[int, list[int]]],
        cumulative: bool,
        claims: Sequence[Claim] = (),
    ) -> None:
        """Acknowledge ``ids`` and every offset of ``ranges`` (``(partition, [start, end, ...])``), but
        not those whose ``claims`` name another leader epoch than their record's (``ack_epochs.py``)."""
        rt, _ = self._attached(stream)
        if ranges:
            ids = ack_offsets(ids, ranges)
        consumer = stream.consumer
        assert consumer is not None
        refused = refuse_stale(rt.machine, consumer, ids, claims, cumulative)
        before = consumer.unacked
        fx, bad = rt.machine.ack(consumer, ids, cumulative, self.now_ms())
        rt.m_acks.inc(max(before - consumer.unacked, 0))
        rt.apply(fx)
        if bad or refused:
            rt.m_epoch_refused["ack"].inc(len(refused))
            raise unknown_ids(bad, refused, "acknowledge")

    def nack(
        self,
        ctx: RequestContext,
        stream: ConsumerStream,
        ids: dict[int, list[int]],
        claims: Sequence[Claim] = (),
    ) -> None:
        rt, _ = self._attached(stream)
        consumer = stream.consumer
        assert consumer is not None
        refused = refuse_stale(rt.machine, consumer, ids, claims)
        fx, bad = rt.machine.nack(consumer, ids, self.now_ms())
        rt.apply(fx)
        if bad or refused:
            rt.m_epoch_refused["nack"].inc(len(refused))
            raise unknown_ids(bad, refused, "nack")

    def disconnect(self, stream: ConsumerStream) -> None:
        """The stream ended (client gone, error, or replaced by a reconnect)."""
        stream.close()
        rt, consumer = stream.runtime, stream.consumer
        if rt is None or consumer is None or rt.closing:
            return
        if rt.streams.get(consumer.consumer_id) is stream:
            del rt.streams[consumer.consumer_id]
        rt.apply(rt.machine.remove_consumer(consumer, self.now_ms()))
        if not rt.machine.consumers:
            rt.last_active_ms = wall_ms()
            self.book.touch(rt)
            if not rt.durable:
                asyncio.get_running_loop().create_task(self.drop(rt))
            elif rt.linger is None:
                linger = self.config.idle_subscription_linger.total_seconds()
                rt.linger = asyncio.get_running_loop().call_later(linger, self._drop_idle, rt)

    def _drop_idle(self, rt: SubscriptionRuntime) -> None:
        rt.linger = None
        if not rt.machine.consumers and not rt.closing:
            asyncio.get_running_loop().create_task(self.drop(rt))

    async def drop(self, rt: SubscriptionRuntime) -> None:
        """Unload a subscription: persist its cursors, stop its feeds, forget it."""
        if rt.closing:
            await rt.closed.wait()
            return
        await rt.shutdown()
        try:
            if rt.durable:
                dirty = [
                    DirtyCursor(rt.topic, rt.name, ps.cursor, rt.topic_id)
                    for ps in rt.machine.partitions.values()
                ]
                dirty = [d for d in dirty if d.cursor.dirty]
                if dirty:
                    try:
                        async with self._save_lock:
                            await self.store.save(dirty, self.link.epoch)
                    except SluiceError as exc:
                        log.error("could not persist the cursors of %s/%s: %s", rt.topic, rt.name, exc)
                self.book.remember(rt)  # still listed while idle (registry.py)
            await self.feedset.detach(rt.topic, rt.machine.partitions, rt)
        finally:
            if self.runtimes.get((rt.topic, rt.name)) is rt:
                del self.runtimes[(rt.topic, rt.name)]
            rt.closed.set()

    # ---- cursors ---------------------------------------------------------------------------------------

    def dirty_cursors(self) -> list[DirtyCursor]:
        return [
            DirtyCursor(rt.topic, rt.name, ps.cursor, rt.topic_id)
            for rt in self.runtimes.values()
            if rt.durable and not rt.closing
            for ps in rt.machine.partitions.values()
            if ps.cursor.dirty
        ]

    def flush_soon(self) -> None:
        """A delivery waits for a cursor flush (its write-ahead mark or a raised count): flush now
        rather than at the next interval. Flushes still run one at a time."""
        self._flush_wanted.set()

    async def flush_cursors(self) -> bool:
        """Persist every dirty cursor; False if the offset store failed (the next flush retries)."""
        dirty = self.dirty_cursors()
        if not dirty or not self.link.epoch:
            return True
        async with self._save_lock:
            try:
                fenced = await self.store.save(dirty, self.link.epoch)
            except SluiceError as exc:
                self.metrics.cursor_flushes.labels("error").inc()
                self.store.flush_failed(len(dirty), exc)  # rate-limited (cursor_store.py)
                return False
        self.store.flush_succeeded()
        self.metrics.cursor_flushes.labels("ok").inc()
        # Saved cursors may have opened their delivery gates: dispatch what waited for them.
        for key in {(d.topic, d.subscription) for d in dirty}:
            saved = self.runtimes.get(key)
            if saved is not None and not saved.closing:
                saved.call(saved.machine.cursors_saved)
        for key in {(d.topic, d.subscription) for d in fenced}:
            rt = self.runtimes.get(key)
            if rt is not None:
                err: SluiceError = NotDispatcher(f"another dispatcher took over {key[0]}/{key[1]}; reconnect")
                if self._replaced(rt, self.link.view):
                    err = _topic_gone(rt)
                for stream in list(rt.streams.values()):
                    stream.fail(err)
                await self.drop(rt)
        return True

    async def _flush_loop(self) -> None:
        interval = self.config.cursor_flush_interval.total_seconds()
        while True:
            with contextlib.suppress(TimeoutError):
                await within(self._flush_wanted.wait(), interval)
            if self._flush_wanted.is_set():
                self.metrics.cursor_flushes_early.inc()
            self._flush_wanted.clear()
            try:
                ok = await self.flush_cursors()
                await self.book.flush_touches()
            except Exception:  # never let the flusher die
                log.exception("cursor flush failed")
                ok = False
            if not ok:
                await asyncio.sleep(interval)  # a failing offset store is not asked in a tight loop

    async def _book_loop(self) -> None:
        await self.link.registered.wait()
        await self.book.refresh_loop(self.config.subscription_refresh_interval.total_seconds())

    # ---- routing changes -------------------------------------------------------------------------------

    def _on_view(self, view: ClusterView) -> None:
        self.store.address = view.offset_store
        for rt in list(self.runtimes.values()):
            if rt.closing or not rt.loaded.is_set():
                continue
            now_mine = set(view.partitions_of(rt.topic, self.dispatcher_id))
            attached = set(rt.machine.partitions)
            t = view.topics.get(rt.topic)
            moved = [
                p
                for p in attached
                if p not in now_mine
                and t is not None
                and p < len(t.partitions)
                and t.partitions[p].dispatcher_id
            ]
            gone = self._replaced(rt, view)
            grown = bool(now_mine - attached)
            if moved or gone or grown:
                log.info(
                    "routing of %s/%s changed (moved %s, new %s): consumers reconnect",
                    rt.topic,
                    rt.name,
                    moved,
                    sorted(now_mine - attached),
                )
                err = (
                    _topic_gone(rt)
                    if gone
                    else view.not_dispatcher(rt.topic, moved or sorted(now_mine - attached))
                )
                for stream in list(rt.streams.values()):
                    stream.fail(err)
                asyncio.get_running_loop().create_task(self.drop(rt))

    @staticmethod
    def _replaced(rt: SubscriptionRuntime, view: ClusterView) -> bool:
        """The topic ``rt`` serves is gone: deleted, or deleted and re-created (another topic_id)."""
        t = view.topics.get(rt.topic)
        return t is None or bool(rt.topic_id and t.topic_id != rt.topic_id)


def _topic_gone(rt: SubscriptionRuntime) -> UnknownTopicOrPartition:
    return UnknownTopicOrPartition(
        f"topic {rt.topic!r} (id {rt.topic_id or '?'}) was deleted, or deleted and re-created: subscription "
        f"{rt.name!r} on it is over; subscribe again to start on the current topic"
    )
