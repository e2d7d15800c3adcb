"""Reading and writing a parking store's topics: the ``.PARK`` log, its ``.PARKSNAP`` snapshots, the DLQ.

I/O for ``parkstore.py`` (docs/poison-keys.md, "Where parked messages live"):

- ``replay``: the store's state for a load. The last snapshot (``retry.parksnap``), verified, then the
  ``.PARK`` log from the offset it covers; a missing or bad snapshot falls back to the whole log.
- ``write_snapshot``: a snapshot's records, appended ``acks=-1`` in order (the trailer last, so a writer
  dying mid-way leaves no trailer at the end and the next load falls back to the log).
- ``dead_sources``: the source coordinates (``sluice-retry-source``) of this topic's records in the DLQ
  from a mark to its end, so a restart does not dead-letter them twice.
- ``live_state``: both: what a load restores, and what ``sluice subscription parked`` lists of a
  subscription not loaded here (the same state, so a listing never shows keys a load would drop).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from sluice.codec.batch import BatchBuilder, Record, batch_views
from sluice.common.list_offsets import EARLIEST, LATEST
from sluice.common.peers import AioPeers
from sluice.common.rpc import error_from_rpc
from sluice.dispatcher.cluster import CoordinatorLink
from sluice.errors import UnknownTopicOrPartition, raise_for_proto
from sluice.retry.levels import H_SOURCE
from sluice.retry.parkbook import ParkBook
from sluice.retry.parksnap import SnapshotError, load_snapshot, snapshot_topic, trailer_count
from sluice.v1 import broker_pb2

log = logging.getLogger(__name__)

__all__ = ["Replayed", "dead_sources", "live_state", "produce", "replay", "write_snapshot"]

RPC_TIMEOUT = 10.0
FETCH_BYTES = 4 * 1024 * 1024
#: Records and bytes per produce of a snapshot.
MAX_RECORDS = 1000
MAX_BYTES = 4 * 1024 * 1024


@dataclass(slots=True)
class Replayed:
    """A replay's outcome: the book, and how it was made (the log, tests)."""

    book: ParkBook
    #: The ``.PARK`` offset the snapshot covered (-1: none used), and the events read after it.
    snapshot_covers: int = -1
    events: int = 0
    #: Why the snapshot was not used ("" if it was, or there was none).
    fallback: str = ""
    #: The ``.PARK`` offset the replay read up to (what a snapshot of ``book`` would cover).
    end: int = 0
    #: ``live_state``: per key, the prefix found in the DLQ and dropped from ``book`` (source
    #: partition, key, through offset): the ``resolved`` events its owner writes.
    dead: list[tuple[tuple[str, int], bytes, int]] = field(default_factory=list)


async def produce(link: CoordinatorLink, channels: AioPeers, name: str, records: list[Record]) -> int:
    """Append ``records`` to partition 0 of ``name`` in one batch (``acks=-1``); returns the offset
    after them."""
    builder = BatchBuilder()
    for r in records:
        builder.append(r.value, r.key, r.tag, r.headers or None, r.timestamp)
    route = link.view.route(name, 0)
    if route is None or not route.broker:
        route = (await link.refresh()).route(name, 0)
    if route is None or not route.broker:
        raise UnknownTopicOrPartition(f"no leader known for {name}/0")
    try:
        resp = await channels.broker(route.broker).Produce(
            broker_pb2.ProduceRequest(
                acks=-1,
                timeout_ms=int(RPC_TIMEOUT * 1000),
                partitions=[broker_pb2.ProducePartition(topic=name, partition=0, records=builder.build())],
            ),
            timeout=RPC_TIMEOUT,
        )
    except grpc.RpcError as exc:
        raise error_from_rpc(exc) from None
    part = resp.partitions[0]
    raise_for_proto(part.error)
    return int(part.base_offset) + len(records)


async def _read(
    link: CoordinatorLink, channels: AioPeers, name: str, start: int, end: int, each: Callable[[Record], None]
) -> int:
    """Call ``each`` with every record of ``name``/0 in [start, end), in order; returns how many."""
    position = start
    n = 0
    deadline = time.monotonic() + 6 * RPC_TIMEOUT
    while position < end:
        if time.monotonic() > deadline:
            raise UnknownTopicOrPartition(f"reading {name} {position}..{end} took too long")
        stub = channels.broker(link.broker_for(name, 0))
        try:
            resp = await stub.Fetch(
                broker_pb2.FetchRequest(
                    # Answered at once while records are there; an answer with none (a leader moving
                    # under the read) waits on the broker instead of this loop asking again at once.
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
                if position <= offset < end:
                    each(view.record(name, 0, i))
                    n += 1
        position = max(position, part.next_offset)
    return n


async def _bounds(link: CoordinatorLink, name: str) -> tuple[int, int] | None:
    """(log start, end) of ``name``/0, None if the topic does not exist."""
    try:
        await link.topic(name, fresh=True)
    except UnknownTopicOrPartition:
        return None
    start = (await link.list_offsets(name, [0], EARLIEST))[0]
    end = (await link.list_offsets(name, [0], LATEST))[0]
    return start, end


async def _last_snapshot(link: CoordinatorLink, channels: AioPeers, name: str) -> tuple[ParkBook, int] | None:
    """The last snapshot of ``name``'s snapshot topic, verified (None if there is none; SnapshotError
    if it cannot be used)."""
    bounds = await _bounds(link, snapshot_topic(name))
    if bounds is None or bounds[1] <= bounds[0]:
        return None
    start, end = bounds
    snap = snapshot_topic(name)
    last: list[Record] = []
    await _read(link, channels, snap, end - 1, end, last.append)
    if not last:
        raise SnapshotError(f"the last record of {snap} could not be read")
    count = trailer_count(last[0])
    first = end - 1 - count
    if first < start:
        raise SnapshotError(f"the snapshot starts at {first}, below the log start {start} of {snap}")
    records: list[Record] = []
    await _read(link, channels, snap, first, end, records.append)
    return load_snapshot(records)


async def replay(link: CoordinatorLink, channels: AioPeers, name: str, use_snapshot: bool = True) -> Replayed:
    """The state of the parking topic ``name``: its last snapshot and the events after it, or every
    event from the log start (an empty book if the topic does not exist: nothing was ever parked)."""
    bounds = await _bounds(link, name)
    if bounds is None:
        return Replayed(ParkBook())
    start, end = bounds
    out = Replayed(ParkBook())
    if use_snapshot:
        try:
            got = await _last_snapshot(link, channels, name)
        except SnapshotError as exc:
            got = None
            out.fallback = str(exc)
        if got is not None:
            book, covers = got
            if covers > end:
                out.fallback = f"the snapshot covers {name} up to {covers}, past its end {end}"
            else:
                if covers < start:
                    log.warning(
                        "%s: events %d..%d were deleted before a snapshot covered them", name, covers, start
                    )
                out.book, out.snapshot_covers = book, covers
                start = max(start, covers)
        if out.fallback:
            log.warning("%s: snapshot not used (%s): replaying the whole log", name, out.fallback)
    out.events = await _read(link, channels, name, start, end, out.book.apply)
    out.end = end
    return out


async def write_snapshot(link: CoordinatorLink, channels: AioPeers, name: str, records: list[Record]) -> None:
    """Append a snapshot's ``records`` (trailer last) to ``name``'s snapshot topic, in order."""
    snap = snapshot_topic(name)
    await link.ensure_topic(snap)
    i = 0
    while i < len(records):
        j, size = i, 0
        while j < len(records) and j - i < MAX_RECORDS and (size < MAX_BYTES or j == i):
            size += len(records[j].value) + 64
            j += 1
        await produce(link, channels, snap, records[i:j])
        i = j


async def dead_sources(
    link: CoordinatorLink, channels: AioPeers, dlq: str, topic: str, mark: int
) -> set[str]:
    """The ``sluice-retry-source`` values of ``topic``'s records in ``dlq`` from ``mark`` to its end
    (from its log start if ``mark`` is past the end: the DLQ was re-created, ``sluice dlq purge``)."""
    bounds = await _bounds(link, dlq)
    if bounds is None:
        return set()
    start, end = bounds
    found: set[str] = set()
    prefix = f"{topic}/"

    def each(r: Record) -> None:
        src = r.headers.get(H_SOURCE) if r.headers else None
        if src is not None:
            text = src.decode("utf-8", "replace")
            if text.startswith(prefix):
                found.add(text)

    await _read(link, channels, dlq, start if mark > end else max(start, mark), end, each)
    return found


async def live_state(link: CoordinatorLink, channels: AioPeers, name: str, dlq: str, topic: str) -> Replayed:
    """The store ``name``'s state (``replay``) less the parked messages of ``topic`` found in ``dlq``
    from the store's DLQ mark on (a crash came between their dead-lettering and its ``resolved``
    event): ``dead`` says what was dropped. Reads only; the caller that owns the store writes the
    ``resolved`` events."""
    out = await replay(link, channels, name)
    book = out.book
    if book.keys and book.dlq_mark is not None:
        found = await dead_sources(link, channels, dlq, topic, book.dlq_mark)
        if found:
            out.dead = book.drop_dead(found)
    return out
