"""The pull consumer's side of poison-key parking: ``fail(record)``, ``is_parked(record)`` and the
``poll()`` pass that hands parked heads out and diverts the records of parked keys (docs/poison-keys.md,
"Pull consumers"). The parking itself is ``parker.Parker``.
"""

from __future__ import annotations

import time

from sluice.client.consumer.engine import ConsumerEngine
from sluice.client.consumer.parker import Parker, ParkOutcome
from sluice.client.consumer.state import PartitionLifecycle
from sluice.codec.batch import Record
from sluice.errors import InvalidArgument, RecordNotOwned
from sluice.retry.levels import source_key
from sluice.serde.records import raw_record

__all__ = ["ParkingEngine"]

TopicPartition = tuple[str, int]
_L = PartitionLifecycle


class ParkingEngine(ConsumerEngine):
    """``ConsumerEngine`` plus the parking API (``Consumer`` derives from it)."""

    #: ``park_poison_keys=True``: set by ``client.consumer`` (it has the producer).
    _park: Parker | None = None

    def fail(self, record: Record) -> ParkOutcome:
        """``record`` failed: park its key (``park_poison_keys=True``). The record and every later record
        of its key from its partition wait, in order, in ``PARK.<group>``; the key's oldest waiting record
        comes back from ``poll()`` after ``park_retry_delay``. Past ``max_redeliver`` failures, the key's
        waiting records go to ``DLQ.<group>`` in order (``parked_policy="dlq"``) or stay parked for an
        operator (``"hold"``). Records of the key later in the same ``poll()`` batch are parked too:
        skip them (``is_parked(record)`` is True). The partition's offsets keep moving.

        Raises InvalidArgument without ``park_poison_keys`` or for a record without a key,
        RecordNotOwned for a record ``poll()`` did not hand out here (or that is committed already).
        """
        self._check_open()
        park = self._park
        if park is None:
            raise InvalidArgument(
                f"group {self.group!r}: fail() needs client.consumer(..., park_poison_keys=True)"
            )
        if not isinstance(record, Record):
            raise InvalidArgument(f"fail() takes a Record from poll(), got {type(record).__name__}")
        record = raw_record(record)
        if record.key is None:
            raise InvalidArgument(
                f"{record.topic}[{record.partition}] offset {record.offset}: a record without a key cannot "
                "be parked (no order to keep): use reconsume_later"
            )
        if not park.is_head(record):
            self._check_handed_out(record)
        return park.fail(record)

    def _before_commit(self) -> None:
        # The parking writes are waited for here, not at every poll (Parker.pace): a commit must never
        # cover a record whose parking is not acknowledged.
        if self._park is not None:
            self._park.flush()

    def is_parked(self, record: Record) -> bool:
        """Whether ``record`` (from the current ``poll()`` batch) was parked behind an earlier failure of
        its key by ``fail()``: skip it, it comes back in order from the parking store."""
        park = self._park
        return park is not None and source_key(record.topic, record.partition, record.offset) in park.recalled

    def _check_handed_out(self, record: Record) -> None:
        with self._lock:
            part = self._state.parts.get((record.topic, record.partition))
            if part is None or part.lifecycle is _L.REVOKING:
                raise RecordNotOwned(
                    f"{record.topic}[{record.partition}] offset {record.offset}: the partition is not "
                    "assigned to this consumer (revoked, lost, or never assigned)"
                )
            if not part.committed <= record.offset < part.position:
                raise RecordNotOwned(
                    f"{record.topic}[{record.partition}] offset {record.offset} was not handed out by "
                    f"poll() or is committed already (handed out: {max(part.committed, 0)}.."
                    f"{part.position - 1})"
                )

    # poll()'s steps, defined by Consumer (consumer.py); _poll_parked runs them with parking.
    def _poll_prepare(self) -> None:
        raise NotImplementedError

    def _poll_take(self, limit: int, deadline: float) -> tuple[list[Record], float | None]:
        raise NotImplementedError

    def _owned_now(self) -> frozenset[TopicPartition]:
        with self._lock:
            return frozenset(tp for tp, p in self._state.parts.items() if p.lifecycle is not _L.REVOKING)

    def _poll_parked(self, park: Parker, limit: int, deadline: float) -> list[Record]:
        """poll() with parking: the last batch's heads are settled first (before a revocation can
        release their partition), the topic is replayed for new partitions before their records are
        taken, and records of parked keys are sent to the parking store before poll() returns the others
        (acknowledged before any commit can cover them)."""
        park.settle()
        while True:
            park.pace()  # commits wait for the parking writes themselves (_before_commit)
            self._poll_prepare()
            owned = self._owned_now()
            park.prepare(owned)
            heads = park.take(owned, limit)
            room = limit - len(heads)
            with self._lock:
                records, wait = self._poll_take(room, deadline) if room > 0 else ([], 0.0)
                if not records and not heads:
                    if wait is None:
                        park.handed([])
                        return []
                    wait = park.wait_bound(wait, owned)
                    if wait > 0:
                        self._ready.wait(wait)
                    continue
            out = heads + park.divert(records) if records else heads
            if out or time.monotonic() >= deadline:
                park.handed(out)
                return out
