"""Taking fetched records out of the prefetch buffer for ``poll()`` and ``poll_columns()``.

Both walk the buffer's chunks the same way: a chunk fetched before a seek, pause or revoke (an older
fetch epoch) is dropped, an empty one moves the partition's position, a chunk larger than the room
left is cut and its rest put back, and every taken record moves its partition's position (and, in
``in-flight-min`` mode, joins its in-flight offsets). ``poll()`` takes :class:`Record` objects,
``poll_columns()`` takes :class:`RecordColumns`; a chunk is decoded in the form the consumer's last poll
asked for and converted if the other one asks for it (docs/consumer.md, "Records as columns").

Caller: the Consumer's poll passes, holding its lock.
"""

from __future__ import annotations

import time
from operator import attrgetter

from sluice.client.consumer.parking_api import ParkingEngine
from sluice.client.consumer.state import PartitionLifecycle
from sluice.codec.batch import Record, RecordColumns
from sluice.errors import InvalidArgument

__all__ = ["CollectingEngine"]

TopicPartition = tuple[str, int]
_OFFSET = attrgetter("offset")
_L = PartitionLifecycle


class CollectingEngine(ParkingEngine):
    """``ParkingEngine`` plus taking records from the buffer (``Consumer`` derives from it)."""

    def _check_columnar(self) -> None:
        """Refuse ``poll_columns`` where a feature needs a record object per record."""
        needs = (
            "deserializers"
            if self._deserialize is not None
            else "retry=True (reconsume_later)"
            if self._retry is not None
            else "park_poison_keys (fail)"
            if self._park is not None
            else 'commit_mode="in-flight-min" (done)'
            if self._state.in_flight_min
            else None
        )
        if needs is not None:
            raise InvalidArgument(
                f"group {self.group!r}: poll_columns() hands out no record objects, which {needs} "
                "needs: use poll()"
            )

    def _poll_take(self, limit: int, deadline: float) -> tuple[list[Record], float | None]:
        """Under the lock: raise a fetch error, else take up to ``limit`` records. Returns them and
        how long to wait before the next pass (0: go again now; None: the deadline passed, or the
        consumer closed)."""
        self._raise_fetch_error()
        records = self._collect(limit)
        if self._deserialize is not None:
            self._deserialize.raise_failed()  # a record handed out alone by _collect
        if records and self._retry is not None:
            records = self._retry.skip_retried(records, self._state)
        return records, 0.0 if records else self._poll_wait(deadline)

    def _poll_take_columns(
        self, limit: int, deadline: float
    ) -> tuple[dict[TopicPartition, RecordColumns], float | None]:
        """``_poll_take`` for ``poll_columns``: the records as columns, per partition."""
        self._raise_fetch_error()
        taken = self._collect_columns(limit)
        return taken, 0.0 if taken else self._poll_wait(deadline)

    def _raise_fetch_error(self) -> None:
        error = self._prefetch.take_error()
        if error is not None:
            self._restart_vanished(error)
            raise error

    def _poll_wait(self, deadline: float) -> float | None:
        """Nothing to take: how long to wait before the next pass (0: go again now; None: the
        deadline passed, or the consumer closed)."""
        now = time.monotonic()
        remaining = deadline - now
        if remaining <= 0 or self._closed:
            return None
        if self._events or self._revocations_ready():
            return 0.0
        wait = remaining
        if self.config.enable_auto_commit:
            wait = min(wait, max(self._next_auto_commit - now, 0.001))
        if self._retry is not None:
            wait = self._retry.wait_bound(wait)
        return wait

    def _collect(self, limit: int) -> list[Record]:
        """Hand out up to ``limit`` buffered records (holding the lock)."""
        out: list[Record] = []
        returned: set[TopicPartition] = set()
        state = self._state
        parts = state.parts
        track_offsets = state.in_flight_min
        while len(out) < limit:
            chunk = self._prefetch.pop()
            if chunk is None:
                break
            part = parts.get(chunk.tp)
            if part is None or part.lifecycle is not _L.FETCHING or part.fetch_epoch != chunk.fetch_epoch:
                continue  # stale: fetched before a seek, pause or revoke
            recs = chunk.as_records()
            left = len(recs) - chunk.start
            if left == 0:
                state.skipped_to(part, chunk.next_offset, chunk.tp not in returned)
                continue
            room = limit - len(out)
            converted = None
            if self._deserialize is not None:
                room, converted = self._deserialize.plan(recs, chunk.start, min(room, left), first=not out)
                if room == 0:  # the chunk's next record fails: the next poll() raises it alone
                    self._prefetch.push_front(chunk)
                    break
            if self._retry is not None and chunk.tp[0] == self._retry.topic:
                due = self._retry.hold_not_due(state, self._prefetch, chunk, part, room)
                if due is not None:  # the partition waits for its head's due time
                    out += due if converted is None else self._deserialize.handed(converted, len(due))  # type: ignore[union-attr]
                    returned.add(chunk.tp)
                    continue
            if left <= room:
                taken = recs if chunk.start == 0 else recs[chunk.start :]
                position = chunk.next_offset
            else:
                taken = recs[chunk.start : chunk.start + room]
                chunk.start += room
                chunk.taken_now = room
                position = taken[-1].offset + 1
                self._prefetch.push_front(chunk)
            out += taken if converted is None else converted
            state.handed_out(part, map(_OFFSET, taken) if track_offsets else (), position)
            if chunk.leader_epoch >= 0:
                self._offsets.leader_epochs[chunk.tp] = chunk.leader_epoch
            returned.add(chunk.tp)
            if converted is not None and self._deserialize.failed is not None:  # type: ignore[union-attr]
                break  # handed out alone: poll() raises it
        return out

    def _collect_columns(self, limit: int) -> dict[TopicPartition, RecordColumns]:
        """``_collect`` as columns: up to ``limit`` buffered records, per partition (holding the lock).
        No deserializer, retry topic or parking here: ``poll_columns`` refuses those consumers."""
        out: dict[TopicPartition, RecordColumns] = {}
        count = 0
        state = self._state
        parts = state.parts
        track_offsets = state.in_flight_min
        prefetch = self._prefetch
        while count < limit:
            chunk = prefetch.pop()
            if chunk is None:
                break
            tp = chunk.tp
            part = parts.get(tp)
            if part is None or part.lifecycle is not _L.FETCHING or part.fetch_epoch != chunk.fetch_epoch:
                continue  # stale: fetched before a seek, pause or revoke
            cols = chunk.as_columns()
            size = len(cols)
            left = size - chunk.start
            if left == 0:
                state.skipped_to(part, chunk.next_offset, tp not in out)
                continue
            room = limit - count
            if left <= room:
                taken = cols if chunk.start == 0 else cols.cut(chunk.start, size)
                position = chunk.next_offset
            else:
                taken = cols.cut(chunk.start, chunk.start + room)
                chunk.start += room
                chunk.taken_now = room
                position = taken.offsets[-1] + 1
                prefetch.push_front(chunk)
            count += len(taken)
            state.handed_out(part, taken.offsets if track_offsets else (), position)
            if chunk.leader_epoch >= 0:
                self._offsets.leader_epochs[tp] = chunk.leader_epoch
            have = out.get(tp)
            if have is None:
                out[tp] = taken
            else:
                have.extend(taken)
        return out
