"""The broker core: the one implementation of every operation the broker serves.

Produce, Fetch (long-poll and continuous), ListOffsets and UpdatePartitions each have one
method here that validates the request, asks the authorizer (``sluice.security.context``),
executes and reports failures as typed ``SluiceError`` (per partition where the answer is
per partition). Callers: the transport adapters (``handlers`` for the gRPC servicer and the
wire connections, which translate protobuf and frames and do nothing else) and the
coordinator link (partition updates). It owns no protobuf; the pure parts it drives are
``fetch``, ``filtering``, ``sessions``, ``assignment`` and the one parked-read mechanism
(``longpoll``). The map: ``docs/architecture.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence

from sluice.broker.assignment import AssignmentUpdate, PartitionRegistry
from sluice.broker.config import BrokerConfig
from sluice.broker.fetch import FetchRead, TopicPartitionKey, validate_limits
from sluice.broker.flusher import Flusher, FlushPolicy
from sluice.broker.follow import ContinuousFetch, Deliver
from sluice.broker.leader_state import check_enough_replicas, wait_committed
from sluice.broker.leading import Leaders
from sluice.broker.log.manager import LogManager
from sluice.broker.log.partition_log import PartitionLog
from sluice.broker.longpoll import AppendWaiters, ParkedRead, SessionWatches, StandingWatch
from sluice.broker.memory import BrokerMemory
from sluice.broker.metrics import BrokerMetrics, broker_metrics, log_stats, producer_stats
from sluice.broker.reading import ReadSteps
from sluice.broker.replica_fetcher import ReplicaFetchers
from sluice.broker.replica_steps import ReplicaSteps
from sluice.broker.requests import (
    CONSUMER_REPLICA_ID,
    DEFAULT_CONTEXT,
    FetchOutcome,
    FetchParams,
    FollowFrom,
    OffsetAnswer,
    OffsetQuery,
    ProduceItem,
    ProduceResult,
    check_continuous,
)
from sluice.broker.schedule.targets import SCHEDULE_TOPIC, schedule_targets
from sluice.broker.sessions import FetchSession, FetchSessionCache
from sluice.broker.update_runner import UpdateRunner
from sluice.errors import (
    BrokerNotAvailable,
    CorruptBatch,
    FetchSessionNotFound,
    InvalidArgument,
    InvalidFetchSessionEpoch,
    InvalidRequest,
    RequestTimedOut,
    SluiceError,
    StorageError,
)
from sluice.security.context import AllowAll, Authorizer, Operation, RequestContext
from sluice.security.model import CLUSTER_RESOURCE, Resource, ResourceType

log = logging.getLogger(__name__)

#: Longest a produce may ask to wait for its fsync.
MAX_PRODUCE_TIMEOUT_MS = 300_000
#: What ``timeout_ms = 0`` means.
DEFAULT_PRODUCE_TIMEOUT_MS = 30_000
#: How long stop() waits for in-flight requests before closing the logs anyway.
DRAIN_TIMEOUT_S = 10.0

__all__ = [
    "DEFAULT_CONTEXT",
    "BrokerService",
    "FetchOutcome",
    "FetchParams",
    "OffsetAnswer",
    "OffsetQuery",
    "ProduceItem",
    "ProduceResult",
]


class _Inflight:
    """Counts running requests so stop() can let them finish before closing the logs."""

    def __init__(self) -> None:
        self.count = 0
        self.idle = asyncio.Event()
        self.idle.set()

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        self.count += 1
        self.idle.clear()
        try:
            yield
        finally:
            self.count -= 1
            if self.count == 0:
                self.idle.set()


class BrokerService(ReadSteps, ReplicaSteps):
    """One broker's request handling over its partition logs."""

    def __init__(
        self,
        config: BrokerConfig,
        logs: LogManager,
        metrics: BrokerMetrics | None = None,
        clock_ms: Callable[[], int] = lambda: int(time.monotonic() * 1000),
        authorizer: Authorizer | None = None,
    ) -> None:
        self.config = config
        self.logs = logs
        self.caps = config.fetch_caps()
        self.metrics = metrics or broker_metrics()
        self._clock_ms = clock_ms
        self.memory = BrokerMemory(config.produce_memory_bytes, config.fetch_memory_bytes)
        # The authorization seam (docs/architecture.md): one call site per operation, below.
        self._authorize = (authorizer or AllowAll()).authorize
        self._checks_schedule_targets = authorizer is not None and not isinstance(authorizer, AllowAll)
        #: Consumers' parked reads: woken by appends, or for a replicated partition by its HW.
        self.waiters = AppendWaiters()
        #: Followers' parked reads (replica fetches): woken by appends to replicated partitions.
        self.replica_waiters = AppendWaiters()
        self.flusher = Flusher(
            config.flush_policy, config.flush_interval.total_seconds(), self.metrics.fsync_round
        )
        self.leaders = Leaders.of(config, self.waiters.notify, clock_ms, self.metrics)
        self.flusher.after_round = self._flushed
        self.fetchers = ReplicaFetchers(config.broker_id, config.coordinator or "", logs, self.flusher)
        self.sessions = FetchSessionCache(
            config.max_fetch_sessions, int(config.fetch_session_idle.total_seconds() * 1000)
        )
        self._session_watches = SessionWatches(self.waiters)
        self.sessions.on_drop = lambda session: self._session_watches.dropped(session.id)
        self.registry = PartitionRegistry(
            logs,
            config.log_defaults(),
            config.data_dir,
            self._on_serve,
            self._on_unserve,
            config.broker_id,
        )
        self._listeners: dict[TopicPartitionKey, Callable[[], None]] = {}
        self._inflight = _Inflight()
        self._stopping = False
        self._updates = UpdateRunner(
            self.registry, self.flusher.io_lock, lambda: self._stopping, self._inflight.track
        )
        self._maintenance: asyncio.Task[None] | None = None
        #: Set after every applied partition update (a controlled shutdown waits on it).
        self.updated = asyncio.Event()

    # ---- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        self.registry.load()
        self.leaders.restore(self.registry.served, self.logs.topic_id, self.registry.epochs.marks)
        self.flusher.start()
        self.leaders.start()
        self._maintenance = asyncio.create_task(self._maintenance_loop(), name="log-maintenance")
        served = self.registry.served
        self.metrics.log_stats.source = lambda: log_stats(served)
        self.metrics.handle_stats.source = self.logs.descriptor_stats
        self.metrics.producer_stats.source = lambda: producer_stats(served)

    async def stop(self) -> None:
        """Refuse new requests, answer parked fetches, fsync, close the logs. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        self.waiters.wake_all()
        self.replica_waiters.wake_all()
        self.leaders.fail_waits(BrokerNotAvailable("the broker is shutting down before the write committed"))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_TIMEOUT_S):
                await self._inflight.idle.wait()
        if self._maintenance is not None:
            self._maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintenance
        await self.fetchers.stop()
        await self.flusher.stop()
        await self.leaders.stop()
        self.metrics.log_stats.source = None
        self.metrics.handle_stats.source = None
        self.metrics.producer_stats.source = None
        self.registry.close()
        try:
            self.logs.flush_all()
        finally:
            self.logs.close()

    def _check_running(self) -> None:
        if self._stopping:
            raise BrokerNotAvailable("the broker is shutting down")

    # ---- serving hooks -------------------------------------------------------------

    def _on_serve(self, key: TopicPartitionKey, plog: PartitionLog) -> None:
        listener = functools.partial(self._appended, key)
        plog.add_append_listener(listener)
        self._listeners[key] = listener
        self.waiters.notify(key)

    def _on_unserve(self, key: TopicPartitionKey, plog: PartitionLog) -> None:
        listener = self._listeners.pop(key, None)
        if listener is not None:
            plog.remove_append_listener(listener)
        # The log may be closed or deleted next, so it leaves the flusher's dirty set; if it
        # has unflushed appends (a produce may be waiting for them), fsync it now. Callers
        # hold io_lock, so no fsync round is running.
        if self.flusher.forget(key) is not None:
            try:
                plog.flush()
            except Exception:
                log.exception("fsync of %s/%s before unserving failed", *key)
        self.leaders.drop(key)
        # Parked fetches on it re-check and answer NOT_LEADER.
        self.waiters.notify(key)
        self.replica_waiters.notify(key)

    # ---- Produce -------------------------------------------------------------------

    async def produce(
        self,
        acks: int,
        timeout_ms: int,
        items: Sequence[ProduceItem],
        ctx: RequestContext = DEFAULT_CONTEXT,
    ) -> list[ProduceResult]:
        """Append each partition's batches; per-partition results, in request order."""
        results, durable = self.append(acks, timeout_ms, items, ctx)
        if durable:
            await self.wait_durable(results, timeout_ms)
        return results

    def append(
        self,
        acks: int,
        timeout_ms: int,
        items: Sequence[ProduceItem],
        ctx: RequestContext = DEFAULT_CONTEXT,
    ) -> tuple[list[ProduceResult], bool]:
        """The synchronous half of a produce: validate and append, in the caller's order.

        Returns the per-partition results and whether the acknowledgement must wait for an
        fsync (``wait_durable``). Split from ``produce`` so ProduceStream appends each
        request the moment it is read, in stream order, while earlier ones await their fsync.
        """
        self._check_running()
        if not items:
            raise InvalidRequest("the produce request names no partitions")
        if acks not in (-1, 0, 1):
            raise InvalidArgument(f"acks must be -1 (all), 0 or 1, got {acks}")
        if not 0 <= timeout_ms <= MAX_PRODUCE_TIMEOUT_MS:
            raise InvalidArgument(f"timeout_ms must be in [0, {MAX_PRODUCE_TIMEOUT_MS}], got {timeout_ms}")
        results = [self._append(item, ctx, acks) for item in items]
        if acks == 0:
            self.flusher.kick()
            return results, False
        durable = self.flusher.policy is FlushPolicy.ALWAYS and any(r.error is None for r in results)
        return results, durable or any(r.commit_offset >= 0 for r in results)

    async def wait_durable(self, results: list[ProduceResult], timeout_ms: int) -> None:
        """Wait until the appends behind ``results`` are fsynced and, under acks=all on a replicated
        partition, committed (the HW passed them); a failure is set on each result."""
        with self._inflight.track():
            deadline = time.monotonic() + (timeout_ms or DEFAULT_PRODUCE_TIMEOUT_MS) / 1000
            if self.flusher.policy is FlushPolicy.ALWAYS:
                await self._wait_durable(results, timeout_ms or DEFAULT_PRODUCE_TIMEOUT_MS)
            await wait_committed(self.leaders.states, results, deadline)

    def _append(self, item: ProduceItem, ctx: RequestContext, acks: int = 1) -> ProduceResult:
        topic, partition = item.topic, item.partition
        try:
            self._authorize(ctx, Operation.WRITE, Resource(ResourceType.TOPIC, topic))
            plog = self.registry.lookup(topic, partition)
            if not item.records:
                raise CorruptBatch(f"no record batches for {topic}/{partition}")
            if topic == SCHEDULE_TOPIC and self._checks_schedule_targets:
                for target in schedule_targets(item.records, partition):  # schedule/targets.py: why
                    self._authorize(ctx, Operation.WRITE, Resource(ResourceType.TOPIC, target))
            state = self.leaders.states.get((topic, partition))
            if acks == -1 and state is not None:
                check_enough_replicas(state)
            appended = plog.append(item.records, leader_epoch=self._leader_epoch(topic, partition))
        except SluiceError as err:
            return ProduceResult(topic, partition, err)
        except OSError as exc:
            log.error("append to %s/%s failed: %s", topic, partition, exc)
            return ProduceResult(
                topic, partition, StorageError(f"append to {topic}/{partition} failed: {exc}")
            )
        except Exception as exc:  # a storage bug must not take the request (or the broker) down
            log.exception("unexpected error appending to %s/%s", topic, partition)
            return ProduceResult(topic, partition, SluiceError(f"internal error appending: {exc!r}"))
        self.flusher.mark_dirty((topic, partition), plog)
        self.metrics.appended(topic, len(item.records), appended.last_offset - appended.base_offset + 1)
        return ProduceResult(
            topic,
            partition,
            None,
            appended.base_offset,
            appended.append_time_ms,
            plog.log_start_offset,
            appended.last_offset if acks == -1 and state is not None else -1,
        )

    def _leader_epoch(self, topic: str, partition: int) -> int:
        """The leader epoch this broker stamps into what it appends to ``topic/partition``.

        The epoch the controller last named for the partition (0 from a sender without replica
        state); the log refuses an epoch older than its latest (a deposed leader's writes).
        """
        mark = self.registry.epochs.marks.get((topic, partition))
        return 0 if mark is None else mark.leader_epoch

    async def _wait_durable(self, results: list[ProduceResult], timeout_ms: int) -> None:
        started = time.perf_counter()
        error: SluiceError | None = None
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await self.flusher.wait_durable()
        except TimeoutError:
            error = RequestTimedOut(f"appended, but the fsync did not finish within {timeout_ms} ms")
        except SluiceError as err:
            error = err
        self.metrics.produce_flush.observe(time.perf_counter() - started)
        if error is not None:
            for r in results:
                if r.error is None:
                    r.error = error

    # ---- Fetch ---------------------------------------------------------------------

    async def fetch(self, params: FetchParams, ctx: RequestContext = DEFAULT_CONTEXT) -> FetchOutcome:
        """Kafka fetch: answer now if possible, else park until appends or max_wait. A continuous
        fetch's outcome says how to follow it (``outcome.follow``); the transport calls
        :meth:`follow` once it has sent this first answer. The answer holds ``held_bytes`` of the
        fetch memory pool until the transport releases them (``docs/memory.md``)."""
        check_continuous(params, ctx)
        self._check_running()
        limits = validate_limits(params.max_wait_ms, params.min_bytes, params.max_bytes, self.caps)
        if params.replica_id != CONSUMER_REPLICA_ID:
            # A follower's fetch (docs/replication.md, "The data path"): it reads up to the log end,
            # parks on appends rather than the HW, and its fetch offsets are its positions.
            ctx = self._replica_fetch(params, ctx)
        with self._inflight.track():
            try:
                session = self.sessions.context(
                    params.session_id,
                    params.session_epoch,
                    params.partitions,
                    params.forgotten,
                    self._clock_ms(),
                )
            except (FetchSessionNotFound, InvalidFetchSessionEpoch) as err:
                return FetchOutcome(params.session_id, [], err)
            finally:
                self.metrics.fetch_sessions.set(len(self.sessions))
            watch = self._session_watches.of(session)
            read = await self.reserved_read(session.specs, limits, ctx, session.others)
            try:
                if not read.ready():
                    await self._park(read, limits.max_wait_ms, session.session, watch, ctx)
                parts = session.select(self.finish_read(read))
            except BaseException:
                self.memory.fetch.release(read.held)  # no answer: nothing held (docs/memory.md)
                raise
            session.settle(read.parts)
            follow = None
            if params.continuous and not any(part.error is not None for part in parts):
                specs = [dataclasses.replace(part.spec, fetch_offset=part.position) for part in parts]
                follow = FollowFrom(specs, limits, params.replica_id)
            return FetchOutcome(session.session_id, parts, follow=follow, held_bytes=self.settle_held(read))

    def follow(
        self,
        plan: FollowFrom,
        ctx: RequestContext,
        deliver: Deliver,
        writable: Callable[[], bool],
    ) -> ContinuousFetch:
        """Go on with a continuous fetch from its first answer (``fetch(...).follow``): each
        round's outcome goes to ``deliver`` until it fails or the caller stops it."""
        if plan.replica_id != CONSUMER_REPLICA_ID:
            ctx = dataclasses.replace(ctx, replica_id=plan.replica_id)
        following = ContinuousFetch(self, plan, ctx, deliver, writable)
        following.start()
        return following

    def parked_read(
        self,
        on_ready: Callable[[], None],
        standing: tuple[StandingWatch, FetchSession, RequestContext] | None = None,
        ctx: RequestContext = DEFAULT_CONTEXT,
    ) -> ParkedRead:
        """The one parked-read mechanism (``longpoll``); with ``standing`` (a session's or follow's
        watch, its session, the caller) parked on it, reading woken partitions in (``read_more``)."""
        if standing is None:
            return ParkedRead(self.waiters_of(ctx), self.read_again, self.metrics.fetch_parked, on_ready)
        watch, session, ctx = standing
        return ParkedRead(
            self.waiters_of(ctx),
            functools.partial(self.read_more, session, ctx),
            self.metrics.fetch_parked,
            on_ready,
            watch,
        )

    async def _park(
        self,
        read: FetchRead,
        max_wait_ms: int,
        session: FetchSession | None,
        watch: StandingWatch | None,
        ctx: RequestContext,
    ) -> None:
        """Wait for appends on the request's partitions until it is ready or max_wait passes."""
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_ready() -> None:
            if not ready.done():
                ready.set_result(None)

        standing = None if session is None or watch is None else (watch, session, ctx)
        parked = self.parked_read(on_ready, standing, ctx)
        parked.park(read, max_wait_ms)
        try:
            await ready
        finally:
            parked.close()

    # ---- UpdatePartitions ------------------------------------------------------------

    async def update_partitions(
        self, update: AssignmentUpdate, ctx: RequestContext = DEFAULT_CONTEXT
    ) -> None:
        """Apply a partition update (from the RPC or a heartbeat response). The logs it creates are made
        in a worker thread, so produces and fetches on the partitions already served are answered
        meanwhile; updates apply one at a time, in arrival order (``update_runner.py``)."""
        self._check_running()
        self._authorize(ctx, Operation.CLUSTER_ACTION, CLUSTER_RESOURCE)
        reconcile = functools.partial(self._reconcile_leaders, update)
        plan = await self._updates.apply(update, self._stop_following_deleted, reconcile)
        self.updated.set()
        if plan is not None:
            log.info(
                "partitions updated to v%d: serving %d, created %d, deleted %d",
                self.registry.metadata_version,
                len(self.registry.served),
                len(plan.create) + len(plan.replace),
                len(plan.delete),
            )

    @property
    def answers_wait_for_fsync(self) -> bool:
        """Acknowledged produces wait for the group commit (flush=always)."""
        return self.flusher.policy is FlushPolicy.ALWAYS

    @property
    def metadata_version(self) -> int:
        return self.registry.metadata_version

    # ---- background ------------------------------------------------------------------

    async def _maintenance_loop(self) -> None:
        interval = self.config.retention_check_interval.total_seconds()
        while True:
            await asyncio.sleep(interval)
            try:
                async with self.flusher.io_lock:
                    self.run_maintenance()
            except Exception:
                log.exception("log maintenance failed")

    def run_maintenance(self) -> None:
        """Roll aged segments and apply retention on every local log."""
        for key in list(self.logs.partitions()):
            plog = self.logs.get(*key)
            if plog is not None:
                plog.maybe_roll()
        starts = {key: plog.log_start_offset for key, plog in self.registry.served.items()}
        deleted = self.logs.apply_retention_all()
        if deleted:
            log.info("retention deleted %s segment(s)", deleted)
            # A moved log start is news to sessions and follows, which read only partitions
            # something happened to: tell their watches as an append would.
            for key, start in starts.items():
                plog = self.registry.served.get(key)
                if plog is not None and plog.log_start_offset != start:
                    self.waiters.notify(key)
