"""The replicated partitions this broker leads: their leader states, kept in step with UpdatePartitions.

Caller: the broker core (``service.py``). docs/replication.md, "The data path".

- :meth:`Leaders.reconcile` runs after every applied partition update: a served partition with more than
  one replica gets a :class:`~sluice.broker.leader_state.LeaderState` (or its state is updated to the
  controller's newer replicas, ISR and epochs); one no longer served loses it, and its acks=all waiters
  get NOT_LEADER. A one-replica partition never has one, so nothing of this runs for it.
- :meth:`check_replica` and :meth:`check_epoch` are the fetch's checks: a replica fetch only from a
  replica of the partition, and the fetcher's leader epoch against the leader's.
- **The HW checkpoint** (``replication-hw.json`` in the data directory): every led partition's HW (with
  its topic incarnation),
  written at most once a second when one moved, and at shutdown (temporary file, fsync, rename). A
  restarted leader starts from it. It may lag the HW the leader had (a kill -9 between two writes),
  never lead it, so a restarted leader exposes at most what was committed; the followers' next fetches
  move it up again. Without a checkpoint entry the HW starts at the log start (the safe side).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from sluice.broker.assignment import PartitionAssignment
from sluice.broker.config import BrokerConfig
from sluice.broker.fetch import TopicPartitionKey
from sluice.broker.flusher import FlushPolicy
from sluice.broker.isr_changes import IsrChanges
from sluice.broker.leader_state import HighWatermarkView, LeaderState
from sluice.broker.log.partition_log import PartitionLog
from sluice.broker.metrics import BrokerMetrics
from sluice.broker.roles import EpochMark
from sluice.errors import FencedLeaderEpoch, InvalidRequest, NotLeader, SluiceError, UnknownLeaderEpoch

log = logging.getLogger(__name__)

__all__ = ["CHECKPOINT_NAME", "Leaders", "check_epoch"]

CHECKPOINT_NAME = "replication-hw.json"
#: Seconds between checkpoint writes (only when some HW moved).
CHECKPOINT_INTERVAL_S = 1.0


def check_epoch(key: TopicPartitionKey, asked: int, current: int) -> None:
    """KIP-320: a fetcher names the leader epoch it believes current (-1: not checked)."""
    if asked < 0 or asked == current:
        return
    if asked < current:
        raise FencedLeaderEpoch(
            f"leader epoch {asked} of {key[0]}/{key[1]} is older than the current {current}: refresh metadata"
        )
    raise UnknownLeaderEpoch(
        f"leader epoch {asked} of {key[0]}/{key[1]} is newer than {current}, the latest this broker knows"
    )


class Leaders:
    """Leader states by partition. Event-loop thread only."""

    def __init__(
        self,
        data_dir: Path,
        broker_id: int,
        flush_always: bool,
        on_advance: Callable[[TopicPartitionKey], None],
        clock_ms: Callable[[], int],
        metrics: BrokerMetrics,
        coordinator: str = "",
        max_lag_ms: int = 10_000,
    ) -> None:
        self.states: dict[TopicPartitionKey, LeaderState] = {}
        self.views: dict[TopicPartitionKey, HighWatermarkView] = {}
        self._path = Path(data_dir) / CHECKPOINT_NAME
        self._broker_id = broker_id
        self._flush_always = flush_always
        self._on_advance = on_advance
        self._clock_ms = clock_ms
        self._checkpoint = self._load()
        self._dirty = False
        self._task: asyncio.Task[None] | None = None
        self.isr = IsrChanges(self.states, coordinator, max_lag_ms, clock_ms, metrics)
        metrics.under_replicated.set_function(self._under_replicated)
        metrics.follower_lag.set_function(self._max_lag)

    @classmethod
    def of(
        cls,
        config: BrokerConfig,
        on_advance: Callable[[TopicPartitionKey], None],
        clock_ms: Callable[[], int],
        metrics: BrokerMetrics,
    ) -> Leaders:
        return cls(
            config.data_dir,
            config.broker_id,
            config.flush_policy is FlushPolicy.ALWAYS,
            on_advance,
            clock_ms,
            metrics,
            config.coordinator or "",
            int(config.replica_lag_time_max.total_seconds() * 1000),
        )

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._checkpoint_loop(), name="hw-checkpoint")
        self.isr.start()

    def fail_waits(self, error: SluiceError) -> None:
        """Stopping: followers' fetches are refused from now on, so no acks=all wait could end well."""
        for state in self.states.values():
            state.fail_waits(error)

    async def stop(self) -> None:
        await self.isr.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for state in self.states.values():
            state.fail_waits(NotLeader("the broker is shutting down"))
        self.write_checkpoint()

    # ---- updates --------------------------------------------------------------------------

    def reconcile(
        self,
        assigned: Iterable[PartitionAssignment],
        served: dict[TopicPartitionKey, PartitionLog],
    ) -> None:
        """After an update: states for the served replicated partitions it names, none for the rest."""
        now = self._clock_ms()
        for item in assigned:
            plog = served.get(item.key)
            if plog is None or len(item.replicas) <= 1:
                self.drop(item.key)
                continue
            state = self.states.get(item.key)
            if state is not None and state.log is not plog:
                self.drop(item.key)
                state = None
            plog.begin_epoch(item.leader_epoch)
            if state is None:
                self._create(item, plog, now)
            else:
                state.reassign(
                    item.replicas,
                    item.isr,
                    item.min_insync_replicas,
                    item.leader_epoch,
                    item.partition_epoch,
                    now,
                )
        for key in [k for k in self.states if k not in served]:
            self.drop(key)

    def _create(self, item: PartitionAssignment, plog: PartitionLog, now: int) -> None:
        state = LeaderState(
            item.key,
            plog,
            self._broker_id,
            item.replicas,
            item.isr,
            item.min_insync_replicas,
            item.leader_epoch,
            item.partition_epoch,
            self._flush_always,
            hw=self._checkpointed(item.key, item.topic_id, plog),
            topic_id=item.topic_id,
            on_advance=self._advanced,
        )
        state.reassign(
            item.replicas, item.isr, item.min_insync_replicas, item.leader_epoch, item.partition_epoch, now
        )
        self.states[item.key] = state
        self.views[item.key] = HighWatermarkView(state)
        log.info(
            "leading %s/%s at leader epoch %d: replicas %s, ISR %s, HW %d",
            *item.key,
            item.leader_epoch,
            list(item.replicas),
            list(item.isr),
            state.hw,
        )

    def drop(self, key: TopicPartitionKey) -> None:
        state = self.states.pop(key, None)
        self.views.pop(key, None)
        if state is not None:
            state.fail_waits(NotLeader(f"this broker no longer leads {key[0]}/{key[1]}"))
            self._checkpoint[key] = (state.topic_id, state.hw)
            self._dirty = True

    def restore(
        self,
        served: Mapping[TopicPartitionKey, PartitionLog],
        topic_id_of: Callable[[str, int], str | None],
        marks: Mapping[TopicPartitionKey, EpochMark],
    ) -> None:
        """At startup, before the controller's first assignment: a served partition this broker led
        replicated (it has a checkpoint entry of the same topic incarnation) reads up to its checkpointed
        HW, which stays put (no ISR is known, so nothing commits and acks=all is refused) until the
        assignment arrives. Without this a restarted leader would serve its whole log to consumers for
        about a heartbeat."""
        now = self._clock_ms()
        for key, plog in served.items():
            entry = self._checkpoint.get(key)
            topic_id = topic_id_of(*key) or ""
            if entry is None or entry[0] != topic_id:
                continue
            mark = marks.get(key)
            epochs = (0, 0) if mark is None else (mark.leader_epoch, mark.partition_epoch)
            item = PartitionAssignment(key[0], topic_id, key[1], leader=self._broker_id)
            self._create(
                dataclasses.replace(item, leader_epoch=epochs[0], partition_epoch=epochs[1]), plog, now
            )

    def _checkpointed(self, key: TopicPartitionKey, topic_id: str, plog: PartitionLog) -> int:
        entry = self._checkpoint.get(key)
        return entry[1] if entry is not None and entry[0] == topic_id else plog.log_start_offset

    def _advanced(self, key: TopicPartitionKey) -> None:
        self._dirty = True
        self._on_advance(key)

    # ---- fetch checks ---------------------------------------------------------------------

    def check_replica(self, key: TopicPartitionKey, replica: int, current_leader_epoch: int) -> None:
        """A replica fetch of ``key`` by broker ``replica``: refused unless it is one of its replicas."""
        state = self.states.get(key)
        if state is None or replica not in state.replicas or replica == self._broker_id:
            raise InvalidRequest(
                f"broker {replica} is not a follower of {key[0]}/{key[1]} on this leader: "
                "only its replicas may fetch as one"
            )
        check_epoch(key, current_leader_epoch, state.leader_epoch)

    def record_fetch(self, key: TopicPartitionKey, replica: int, leo: int, flushed: int) -> None:
        state = self.states.get(key)
        if state is not None:
            state.record_fetch(replica, leo, flushed, self._clock_ms())
            if (replica not in state.isr) == (leo >= state.hw):
                self.isr.nudge()  # it may rejoin the ISR, or (in it, below the HW) it lost records: out

    # ---- metrics (read from the metrics thread: copies, never the live dicts' iterators) -------

    def _under_replicated(self) -> float:
        return float(sum(1 for s in list(self.states.values()) if len(s.isr) < len(s.replicas)))

    def _max_lag(self) -> float:
        lag = 0
        for state in list(self.states.values()):
            end = state.log.log_end_offset
            for pos in list(state.followers.values()):
                lag = max(lag, end - max(pos.leo, 0))
        return float(lag)

    def error_of(self, key: TopicPartitionKey, replica: int, current_leader_epoch: int) -> SluiceError | None:
        try:
            self.check_replica(key, replica, current_leader_epoch)
        except SluiceError as err:
            return err
        return None

    # ---- the checkpoint -------------------------------------------------------------------

    def _load(self) -> dict[TopicPartitionKey, tuple[str, int]]:
        try:
            raw = json.loads(self._path.read_text())
            return {(str(t), int(p)): (str(tid), int(hw)) for t, p, tid, hw in raw["hw"]}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # A damaged checkpoint: every HW starts at its log start, the safe side.
            log.warning("ignoring the unreadable HW checkpoint %s: %s", self._path, exc)
            return {}

    def _snapshot(self) -> str:
        """The checkpoint's contents, taken on the event loop (the states change there)."""
        for key, state in self.states.items():
            self._checkpoint[key] = (state.topic_id, state.hw)
        self._dirty = False
        entries = [[t, p, tid, hw] for (t, p), (tid, hw) in sorted(self._checkpoint.items())]
        return json.dumps({"hw": entries})

    def write_checkpoint(self) -> None:
        self._write(self._snapshot())

    def _write(self, body: str) -> None:
        tmp = self._path.with_suffix(".tmp")
        try:
            with open(tmp, "w") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path)
        except OSError as exc:
            log.error("cannot write the HW checkpoint %s: %s", self._path, exc)

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(CHECKPOINT_INTERVAL_S)
            if self._dirty:
                await asyncio.to_thread(self._write, self._snapshot())
