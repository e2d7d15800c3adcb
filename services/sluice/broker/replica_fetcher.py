"""The follower side of replication: fetch every followed partition from its leader, byte for byte.

docs/replication.md, "The data path". One :class:`LeaderFetcher` (an asyncio task) per leader broker, over
all the partitions this broker follows from it, re-planned by :meth:`ReplicaFetchers.replan` after every
applied partition update (a role, leader or epoch change):

1. **Truncate first.** A partition new to the fetcher (or whose leader epoch changed) asks the leader
   ``OffsetForLeaderEpoch`` until both agree on an epoch (``log.truncation.divergence_offset``, KIP-101 and
   KIP-279) and cuts its log there, never at a high watermark.
2. **Fetch from the log end.** One long-polled ``Fetch`` for all its partitions, with ``replica_id`` (this
   broker), each partition's LEO as fetch offset, the leader epoch it follows and the offset it has
   fsync'ed. The leader answers as soon as any of them has new batches (``min_bytes`` 1).
3. **Append byte for byte.** ``append_replicated`` CRC-checks every batch and appends it unchanged (offsets,
   append time and leader epoch as the leader stamped them). Under ``flush=always`` the fetcher waits for
   the group commit before its next fetch, so the flushed offset it reports is on disk.

Fetches go over the leader's wire port (``replica_wire.py``; gRPC when it has none). Why long-poll fetches
rather than the wire protocol's continuous fetch: the leader's HW needs each
follower's *confirmed* log end; a continuous fetch advances on what the leader sent, with no
acknowledgement path, while every long-poll request carries the follower's LEO (Kafka's design). The
leader serves a continuous replica fetch too (both transports), positions then counting from its request.

Errors: a leader that cannot be reached is retried with the peer backoff (``common/backoff.py``), its
address looked up again from the coordinator's metadata; a partition error (NOT_LEADER, an unknown or fenced
epoch: the leader may not have applied the same update yet) leaves that partition out for half a second,
or until the next update re-plans it; OFFSET_OUT_OF_RANGE (the leader's log start moved
past ours) empties the log and starts it at the leader's log start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from sluice.broker import stages
from sluice.broker.assignment import PartitionAssignment
from sluice.broker.fetch import TopicPartitionKey
from sluice.broker.flusher import Flusher, FlushPolicy
from sluice.broker.log.manager import LogManager
from sluice.broker.log.partition_log import PartitionLog
from sluice.broker.log.truncation import divergence_offset
from sluice.broker.replica_throttle import Throttle
from sluice.broker.replica_wire import ReplicaWire
from sluice.common.backoff import Backoff
from sluice.common.list_offsets import RetryBound, list_offsets
from sluice.common.peers import AioPeers
from sluice.common.rpc import error_from_rpc
from sluice.errors import OffsetOutOfRange, SluiceError, StorageFull, error_from_proto
from sluice.v1 import broker_pb2, coordinator_pb2

if TYPE_CHECKING:
    from sluice.v1 import broker_pb2_grpc

log = logging.getLogger(__name__)

__all__ = ["FETCH_MAX_WAIT_MS", "LeaderFetcher", "ReplicaFetchers"]

#: A follower's long-poll: answered at once when the leader has batches, else after this.
FETCH_MAX_WAIT_MS = 500
#: Per partition per fetch (the leader's cap bounds the whole answer).
PARTITION_MAX_BYTES = 4 * 1024 * 1024
RPC_TIMEOUT_S = 10.0
#: How long a partition the leader answered with an error waits before it is fetched again.
PARK_S = 0.5
#: ListOffsets' "earliest".
EARLIEST = -2


@dataclass(slots=True)
class Followed:
    """One followed partition inside its leader's fetcher."""

    assignment: PartitionAssignment
    log: PartitionLog
    #: Truncation to the divergence point is still to do (new, or a new leader epoch).
    truncate: bool = True
    #: The leader answered an error: fetch nothing until the next update re-plans it.
    parked: bool = False
    #: The leader's HW from its last answer (-1: none yet).
    leader_hw: int = -1
    #: A reassignment's replication throttle while this broker is outside the ISR; None: unthrottled.
    throttle: Throttle | None = None


if TYPE_CHECKING:
    BrokerStub = broker_pb2_grpc.BrokerAsyncStub


async def _fetch(stub: BrokerStub, request: broker_pb2.FetchRequest) -> broker_pb2.FetchResponse:
    return await stub.Fetch(request, timeout=RPC_TIMEOUT_S)


class LeaderFetcher:
    """Fetches every partition this broker follows from one leader broker. Event-loop thread only."""

    def __init__(
        self,
        leader_id: int,
        broker_id: int,
        resolve: Callable[[int, str], Awaitable[str | None]],
        peers: AioPeers,
        flusher: Flusher,
        wire_of: Callable[[int], tuple[str, int] | None] = lambda _b: None,
    ) -> None:
        self.leader_id = leader_id
        self._broker_id = broker_id
        self._resolve = resolve
        self._peers = peers
        self._flusher = flusher
        self._wire_of = wire_of
        #: The open wire connection to the leader, if it has a wire port.
        self._conn: ReplicaWire | None = None
        self.partitions: dict[TopicPartitionKey, Followed] = {}
        self._changed = asyncio.Event()
        #: The fetch in flight (a change cancels it: ``_poke``).
        self._call: asyncio.Future[broker_pb2.FetchResponse] | None = None
        self._task: asyncio.Task[None] | None = None
        #: Fetch answers applied (tests wait on progress with it).
        self.rounds = 0
        #: The timer that wakes the loop when a throttled partition may fetch again.
        self._wake: asyncio.TimerHandle | None = None

    def set_partitions(
        self, wanted: Mapping[TopicPartitionKey, tuple[PartitionAssignment, PartitionLog]]
    ) -> None:
        for key in [k for k in self.partitions if k not in wanted]:
            del self.partitions[key]
        for key, (item, plog) in wanted.items():
            current = self.partitions.get(key)
            if (
                current is None
                or current.log is not plog
                or current.assignment.leader_epoch != item.leader_epoch
                # Damage found since (a read or the scrub): truncate below it and fetch it again.
                or bool(plog.corrupt_ranges)
            ):
                self.partitions[key] = Followed(item, plog)
            else:
                current.assignment = item
                current.parked = False
            self._set_throttle(self.partitions[key], item)
        self._poke()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"replica-fetcher-{self.leader_id}")

    def _poke(self) -> None:
        """The partitions or their state changed: plan again, dropping the fetch in flight."""
        self._changed.set()
        call = self._call
        if call is not None and not call.done():
            call.cancel()

    def _set_throttle(self, followed: Followed, item: PartitionAssignment) -> None:
        rate = item.throttle_bytes_per_second if self._broker_id not in item.isr else 0
        if rate <= 0:
            followed.throttle = None
        elif followed.throttle is None or followed.throttle.rate != rate:
            followed.throttle = Throttle(rate, time.monotonic())

    def _throttled_out(self, candidates: Mapping[TopicPartitionKey, Followed]) -> set[TopicPartitionKey]:
        """Partitions whose throttle bucket is empty now; a timer wakes the loop when the first refills."""
        now = time.monotonic()
        out = {k for k, f in candidates.items() if f.throttle is not None and f.throttle.allowance(now) == 0}
        if out:
            wait = min(t.wait_s(now) for k in out if (t := candidates[k].throttle) is not None)
            if self._wake is not None:
                self._wake.cancel()
            self._wake = asyncio.get_running_loop().call_later(max(wait, 0.001), self._poke)
        return out

    def _park(self, followed: Followed) -> None:
        """Leave a partition out for a while after an error. Not until the next update: the error may be
        the leader not having applied the same update yet (a new topic, a new epoch: UNKNOWN_TOPIC,
        UNKNOWN_LEADER_EPOCH), and no further update may come."""
        followed.parked = True

        def unpark() -> None:
            if self.partitions.get(followed.assignment.key) is followed:
                followed.parked = False
                self._poke()

        asyncio.get_running_loop().call_later(PARK_S, unpark)

    async def stop(self) -> None:
        if self._wake is not None:
            self._wake.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ---- the loop ------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = Backoff()
        while True:
            topic = next(iter(self.partitions), ("", 0))[0]
            address = await self._resolve(self.leader_id, topic)
            if address is None:
                await asyncio.sleep(backoff.next())
                continue
            try:
                await self._follow(address, backoff)
            except (SluiceError, OSError, TimeoutError) as exc:  # the wire connection broke
                delay = backoff.next()
                log.warning("leader %d at %s: %s; again in %.1fs", self.leader_id, address, exc, delay)
                await asyncio.sleep(delay)
            except grpc.RpcError as exc:
                delay = backoff.next()
                log.warning(
                    "leader %d at %s: %s; again in %.1fs", self.leader_id, address, error_from_rpc(exc), delay
                )
                self._peers.drop(address)
                await asyncio.sleep(delay)
            except Exception:
                delay = backoff.next()
                log.exception("replica fetcher of leader %d failed; again in %.1fs", self.leader_id, delay)
                await asyncio.sleep(delay)

    async def _follow(self, address: str, backoff: Backoff) -> None:
        stub = self._peers.broker(address)
        wire = self._wire_of(self.leader_id)
        try:
            await self._follow_on(address, stub, wire, backoff)
        finally:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    async def _fetch(
        self, stub: BrokerStub, wire: tuple[str, int] | None, request: broker_pb2.FetchRequest
    ) -> broker_pb2.FetchResponse:
        """Over the leader's wire port when it has one (no thread hand-offs per message), else gRPC."""
        if wire is None:
            return await _fetch(stub, request)
        if self._conn is None or self._conn.closed:
            self._conn = await ReplicaWire.open(wire[0], wire[1], self._broker_id)
        return await self._conn.fetch(request)

    def _start_fetch(
        self, stub: BrokerStub, wire: tuple[str, int] | None, request: broker_pb2.FetchRequest
    ) -> asyncio.Future[broker_pb2.FetchResponse]:
        """The fetch, in flight; on an open wire connection its frame is written now, in the loop pass
        that appended the previous answer, and the answer resolves it in the read callback (no task)."""
        conn = self._conn
        if wire is not None and conn is not None and not conn.closed:
            return conn.request(request)
        return asyncio.ensure_future(self._fetch(stub, wire, request))

    async def _follow_on(
        self,
        address: str,
        stub: BrokerStub,
        wire: tuple[str, int] | None,
        backoff: Backoff,
    ) -> None:
        while True:
            self._changed.clear()
            for key, followed in list(self.partitions.items()):
                if followed.truncate and not followed.parked:
                    await self._truncate(address, key, followed)
            ready = {k: f for k, f in self.partitions.items() if not f.parked and not f.truncate}
            waiting = self._throttled_out(ready)
            active = {k: f for k, f in ready.items() if k not in waiting}
            if not active:
                await self._changed.wait()
                continue
            if self._changed.is_set():
                continue  # changed while truncating: plan again first
            # Awaited alone, a change (``_poke``) cancels it: no task nor asyncio.wait per round
            # (docs/replication.md, "Fifth pass").
            call = self._call = self._start_fetch(stub, wire, self._request(active))
            try:
                await call
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not call.cancelled() or (task is not None and task.cancelling()):
                    raise  # the fetcher itself is stopping
                if self._conn is not None:
                    self._conn.close()  # its answer may still come: a fresh connection next
                continue  # re-planned: ask again with the new set
            finally:
                self._call = None
            response = call.result()
            backoff.reset()
            await self._apply(response, active)
            if self._conn is not None:
                stages.REPLICA_APPLY.observe(time.perf_counter() - self._conn.read_at)

    def _request(self, active: Mapping[TopicPartitionKey, Followed]) -> broker_pb2.FetchRequest:
        report_flushed = self._flusher.policy is FlushPolicy.ALWAYS
        now = time.monotonic()
        return broker_pb2.FetchRequest(
            max_wait_ms=FETCH_MAX_WAIT_MS,
            min_bytes=1,
            session_epoch=-1,
            replica_id=self._broker_id,
            partitions=[
                broker_pb2.FetchPartition(
                    topic=key[0],
                    partition=key[1],
                    fetch_offset=f.log.log_end_offset,
                    partition_max_bytes=PARTITION_MAX_BYTES
                    if f.throttle is None
                    else min(PARTITION_MAX_BYTES, f.throttle.allowance(now)),
                    current_leader_epoch=f.assignment.leader_epoch,
                    replica_flushed_offset=f.log.flushed_offset if report_flushed else -1,
                )
                for key, f in active.items()
            ],
        )

    async def _apply(
        self,
        response: broker_pb2.FetchResponse,
        active: Mapping[TopicPartitionKey, Followed],
    ) -> None:
        appended = False
        for part in response.partitions:
            key = (part.topic, part.partition)
            followed = self.partitions.get(key)
            if followed is None or followed is not active.get(key):
                continue  # re-planned meanwhile
            error = error_from_proto(part.error)
            if isinstance(error, OffsetOutOfRange):
                followed.truncate = True  # the leader's log start passed ours: start again there
                continue
            if error is not None:
                log.info("following %s/%s from leader %d: %s", *key, self.leader_id, error)
                self._park(followed)
                continue
            followed.leader_hw = part.high_watermark
            if followed.throttle is not None and part.records:
                followed.throttle.spend(len(part.records), time.monotonic())
            if part.records:
                try:
                    followed.log.append_replicated(part.records)
                except StorageFull as err:
                    # Our disk is (nearly) full: stop fetching the partition for a while rather than
                    # pulling the same bytes in a loop; the leader drops us from the ISR by lag time.
                    log.debug("following %s/%s paused: %s", *key, err)  # the guard logs the state change
                    self._park(followed)
                    continue
                except SluiceError as err:
                    # A batch that fails its CRC, or does not start at our end: fetch again from the
                    # log end (a damaged copy is never appended).
                    log.error("replicated batches of %s/%s refused: %s", *key, err)
                    continue
                self._flusher.mark_dirty(key, followed.log)
                appended = True
        self.rounds += 1
        if appended and self._flusher.policy is FlushPolicy.ALWAYS:
            await self._flusher.wait_durable()  # the next fetch reports what is on disk
        if response.error.code:
            raise error_from_proto(response.error) or SluiceError("fetch failed")

    async def _truncate(self, address: str, key: TopicPartitionKey, followed: Followed) -> None:
        """Cut the log back to where it diverges from the leader's (OffsetForLeaderEpoch)."""
        plog = followed.log
        epoch_now = followed.assignment.leader_epoch
        loop = asyncio.get_running_loop()
        broker_stub = self._peers.broker(address)

        async def ask_async(epoch: int) -> tuple[int, int]:
            resp = await broker_stub.OffsetForLeaderEpoch(
                broker_pb2.OffsetForLeaderEpochRequest(
                    replica_id=self._broker_id,
                    partitions=[
                        broker_pb2.OffsetForLeaderEpochPartition(
                            topic=key[0], partition=key[1], leader_epoch=epoch, current_leader_epoch=epoch_now
                        )
                    ],
                ),
                timeout=RPC_TIMEOUT_S,
            )
            answer = resp.partitions[0]
            err = error_from_proto(answer.error)
            if err is not None:
                raise err
            return answer.leader_epoch, answer.end_offset

        def ask(epoch: int) -> tuple[int, int]:
            return asyncio.run_coroutine_threadsafe(ask_async(epoch), loop).result(RPC_TIMEOUT_S)

        try:
            offset = await asyncio.to_thread(divergence_offset, plog, ask)
            offset = _below_damage(plog, offset)
            if offset < 0:
                start = await self._leader_log_start(address, key)
                if plog.log_end_offset != start or plog.log_start_offset != start:
                    plog.truncate_fully_and_start_at(start)
            elif offset < plog.log_end_offset:
                log.info("%s/%s diverges from leader %d at %d: truncating", *key, self.leader_id, offset)
                plog.truncate_to(offset)
            elif plog.log_end_offset < (start := await self._leader_log_start(address, key)):
                plog.truncate_fully_and_start_at(start)
        except SluiceError as err:
            log.info("truncating %s/%s against leader %d: %s", *key, self.leader_id, err)
            self._park(followed)
            return
        followed.truncate = False

    async def _leader_log_start(self, address: str, key: TopicPartitionKey) -> int:
        """The leader's log start (ListOffsets earliest, through the one planner)."""
        answer = await list_offsets(
            self._peers,
            [key],
            EARLIEST,
            lambda _t, _p: address,
            bound=RetryBound(RPC_TIMEOUT_S, rounds=1),
            rpc_timeout=RPC_TIMEOUT_S,
        )
        if key in answer.errors:
            raise answer.errors[key]
        return answer.offsets[key]


class ReplicaFetchers:
    """This broker's fetchers, one per leader it follows partitions of. Caller: the broker core."""

    def __init__(self, broker_id: int, coordinator: str, logs: LogManager, flusher: Flusher) -> None:
        self._broker_id = broker_id
        self._coordinator = coordinator
        self._logs = logs
        self._flusher = flusher
        self._peers = AioPeers()
        self.fetchers: dict[int, LeaderFetcher] = {}
        self._addresses: dict[int, str] = {}
        #: Brokers' wire endpoints (host, port), for those that serve one.
        self._wires: dict[int, tuple[str, int]] = {}
        #: Fetchers of leaders no longer followed, while they stop.
        self._stopping: set[asyncio.Task[None]] = set()

    def replan(self, following: Mapping[TopicPartitionKey, PartitionAssignment]) -> None:
        """Follow exactly ``following`` (the registry's followed partitions), each from its leader."""
        by_leader: dict[int, dict[TopicPartitionKey, tuple[PartitionAssignment, PartitionLog]]] = {}
        for key, item in following.items():
            plog = self._logs.get(*key)
            if plog is None or item.leader is None or item.leader < 0 or not self._coordinator:
                continue
            by_leader.setdefault(item.leader, {})[key] = (item, plog)
        for leader_id in [lid for lid in self.fetchers if lid not in by_leader]:
            task = asyncio.get_running_loop().create_task(self.fetchers.pop(leader_id).stop())
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
        for leader_id, wanted in by_leader.items():
            found = self.fetchers.get(leader_id)
            if found is None:
                found = self.fetchers[leader_id] = LeaderFetcher(
                    leader_id, self._broker_id, self._resolve, self._peers, self._flusher, self._wires.get
                )
            found.set_partitions(wanted)

    async def stop(self) -> None:
        for fetcher in self.fetchers.values():
            await fetcher.stop()
        self.fetchers.clear()
        await self._peers.close()

    async def _resolve(self, broker_id: int, topic: str) -> str | None:
        """A broker's gRPC address, from the coordinator's metadata (asked for one topic: the
        answer lists every broker whatever the topics)."""
        try:
            resp = await self._peers.coordinator(self._coordinator).Metadata(
                coordinator_pb2.MetadataRequest(topics=[topic] if topic else []), timeout=RPC_TIMEOUT_S
            )
        except grpc.RpcError as exc:
            log.warning("cannot look up broker %d at the coordinator: %s", broker_id, error_from_rpc(exc))
            return self._addresses.get(broker_id)
        for broker in resp.brokers:
            self._addresses[broker.broker_id] = f"{broker.endpoint.host}:{broker.endpoint.port}"
            if broker.endpoint.wire_port > 0:
                self._wires[broker.broker_id] = (broker.endpoint.host, broker.endpoint.wire_port)
        return self._addresses.get(broker_id)


def _below_damage(plog: PartitionLog, divergence: int) -> int:
    """The truncation point: the divergence, or the first batch this replica's recovery found damaged
    (``corrupt_ranges``: bit rot kept in place, never served), whichever is lower. Everything from there
    is fetched again from the leader, which is how a damaged follower heals from a good copy
    (docs/replication.md, "Power loss and corruption"). -1 (nothing shared) stays -1; a damaged first
    batch at the log start empties the log (-1: start again at the leader's log start)."""
    if not plog.corrupt_ranges:
        return divergence
    damaged = min(start for start, _ in plog.corrupt_ranges)
    log.warning("%s: damaged from offset %d: re-fetching from the leader", plog.directory.name, damaged)
    if damaged <= plog.log_start_offset:
        return -1
    return damaged if divergence < 0 or damaged < divergence else divergence
