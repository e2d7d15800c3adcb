"""The broker's served set on disk: a snapshot plus an append-only journal of changes.

Files under the data directory (docs/storage.md, "The assignment journal"):

- ``.broker-assignment.snapshot``: one frame, ``{"generation": g, "served": [[topic, partition], ...],
  "epochs": [[topic, partition, topic_id, leader_epoch, partition_epoch(, 1 if replicated)], ...],
  "controller_epoch": c}``;
  replaced atomically (write a temporary file, fsync, rename, fsync the directory);
- ``.broker-assignment.journal``: a header frame ``{"generation": g}``, then one frame per applied
  update that changed the served set or an epoch, ``{"serve": [...], "unserve": [...], "epochs": [...],
  "controller_epoch": c}`` (the last two only when they changed), fsynced before the update is
  acknowledged.

The epochs are the highest controller epoch and per-partition (leader, partition) epochs this broker has
seen (``roles.py``): persisted so that a restarted broker still refuses an order older than one it obeyed.

A frame is ``u32 length | u32 crc32(payload) | payload`` (big endian, payload JSON). Recovery reads the
journal frame by frame and stops at the first frame that is short or fails its CRC: a write torn by
``kill -9`` or power loss. Everything before it was written (and fsynced) whole and is kept; the rest is
cut, as the log's recovery cuts a segment's torn tail. A journal whose generation is not the snapshot's
is older than the snapshot (a crash between the two renames of a compaction) and is ignored: the
snapshot already holds its changes.

Why: the served set used to be rewritten and fsynced whole (75 KB at 5,000 partitions) on every update,
so building P partitions cost O(P^2). An update now costs one append and one fsync of its own changes;
the journal is folded into a new snapshot once it is larger than the snapshot (and than
``MIN_COMPACT_BYTES``), so compaction costs O(1) amortized per change and the files stay O(P).

Caller: :class:`sluice.broker.assignment.PartitionRegistry` (its event loop, one at a time).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.broker.fetch import TopicPartitionKey
from sluice.broker.roles import EpochMark, marks_from_json

log = logging.getLogger(__name__)

SNAPSHOT_FILE = ".broker-assignment.snapshot"
JOURNAL_FILE = ".broker-assignment.journal"
#: The whole-file format of earlier versions: read once, then replaced by a snapshot.
LEGACY_FILE = ".broker-assignment.json"
#: Below this size the journal is never compacted: a snapshot per few updates would cost more than
#: replaying a few hundred small frames at start-up.
MIN_COMPACT_BYTES = 64 * 1024
#: A frame longer than this is garbage (a torn or flipped length), not a record.
MAX_FRAME_BYTES = 64 * 1024 * 1024

_HEADER = struct.Struct(">II")


def encode_frame(payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


def decode_frames(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The whole frames at the start of ``data`` and the length they span; the rest is a torn or
    corrupted tail."""
    frames: list[dict[str, Any]] = []
    pos = 0
    while pos + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, pos)
        end = pos + _HEADER.size + length
        if length > MAX_FRAME_BYTES or end > len(data):
            break
        body = data[pos + _HEADER.size : end]
        if zlib.crc32(body) != crc:
            break
        try:
            frame = json.loads(body)
        except ValueError:
            break
        if not isinstance(frame, dict):
            break
        frames.append(frame)
        pos = end
    return frames, pos


def _keys(raw: Any) -> set[TopicPartitionKey]:
    return {(str(t), int(p)) for t, p in raw}


@dataclass
class JournalRecovery:
    """What start-up found: the recorded served set (None: nothing usable was recorded) and any damage."""

    served: set[TopicPartitionKey] | None = None
    #: Change frames replayed on top of the snapshot.
    replayed: int = 0
    #: Human-readable descriptions of corruption found (empty: the files were intact).
    corruption: list[str] = field(default_factory=list)
    #: Bytes cut from the journal's tail.
    cut_bytes: int = 0
    #: The highest controller epoch and per-partition epochs recorded (0 and {} when none).
    controller_epoch: int = 0
    epochs: dict[TopicPartitionKey, EpochMark] = field(default_factory=dict)


class AssignmentJournal:
    """Appends served-set changes; :meth:`recover` reads them back, :meth:`compact` folds them."""

    def __init__(self, data_dir: Path, min_compact_bytes: int = MIN_COMPACT_BYTES) -> None:
        self.data_dir = Path(data_dir)
        self.snapshot_path = self.data_dir / SNAPSHOT_FILE
        self.journal_path = self.data_dir / JOURNAL_FILE
        self.legacy_path = self.data_dir / LEGACY_FILE
        self.min_compact_bytes = min_compact_bytes
        self.generation = 0
        self.snapshot_bytes = 0
        self.journal_bytes = 0
        #: Frames appended since the last snapshot (tests and metrics).
        self.appended = 0
        self.compactions = 0
        self._fd: int | None = None

    # ---- start-up --------------------------------------------------------------------

    def recover(self) -> JournalRecovery:
        """Read the snapshot and replay the journal over it. Changes nothing on disk: the caller then
        calls :meth:`compact` with the set it decided to serve, which starts a fresh journal."""
        found = JournalRecovery()
        snapshot = self._read_snapshot(found)
        if snapshot is None:
            found.served = self._read_legacy(found)
            return found
        generation, served, found.epochs, found.controller_epoch = snapshot
        self.generation = generation
        try:
            data = self.journal_path.read_bytes()
        except FileNotFoundError:
            data = b""
        frames, good = decode_frames(data)
        if good < len(data):
            found.cut_bytes = len(data) - good
            found.corruption.append(
                f"{self.journal_path}: torn or corrupted frame at byte {good}; "
                f"cut {found.cut_bytes} bytes, kept {len(frames)} frames"
            )
        if frames and frames[0].get("generation") == generation:
            for frame in frames[1:]:
                served -= _keys(frame.get("unserve", ()))
                served |= _keys(frame.get("serve", ()))
                found.epochs.update(marks_from_json(frame.get("epochs", ())))
                found.controller_epoch = max(found.controller_epoch, int(frame.get("controller_epoch", 0)))
                found.replayed += 1
        elif frames:
            log.info("ignoring %s of generation %s: older than the snapshot", self.journal_path, frames[0])
        found.served = served
        return found

    def _read_snapshot(
        self, found: JournalRecovery
    ) -> tuple[int, set[TopicPartitionKey], dict[TopicPartitionKey, EpochMark], int] | None:
        try:
            data = self.snapshot_path.read_bytes()
        except FileNotFoundError:
            return None
        frames, good = decode_frames(data)
        try:
            if len(frames) != 1 or good != len(data):
                raise ValueError("not exactly one whole frame")
            frame = frames[0]
            return (
                int(frame["generation"]),
                _keys(frame["served"]),
                marks_from_json(frame.get("epochs", ())),
                int(frame.get("controller_epoch", 0)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            found.corruption.append(f"{self.snapshot_path}: unreadable ({exc}); serving every local log")
            return None

    def _read_legacy(self, found: JournalRecovery) -> set[TopicPartitionKey] | None:
        try:
            raw = json.loads(self.legacy_path.read_text())
            return _keys(raw["served"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            found.corruption.append(f"{self.legacy_path}: unreadable ({exc}); serving every local partition")
            return None

    # ---- changes ---------------------------------------------------------------------

    def append(
        self,
        serve: Iterable[TopicPartitionKey],
        unserve: Iterable[TopicPartitionKey],
        epochs: Mapping[TopicPartitionKey, EpochMark] | None = None,
        controller_epoch: int = 0,
    ) -> None:
        """Record one update's changes durably (one write, one fsync). Raises OSError."""
        if self._fd is None:
            raise RuntimeError("the assignment journal is not open: call compact() first")
        payload: dict[str, Any] = {"serve": sorted(serve), "unserve": sorted(unserve)}
        if epochs:
            payload["epochs"] = [mark.to_json(key) for key, mark in sorted(epochs.items())]
        if controller_epoch:
            payload["controller_epoch"] = controller_epoch
        frame = encode_frame(payload)
        try:
            written = os.write(self._fd, frame)
            if written != len(frame):
                raise OSError(f"short write to {self.journal_path}: {written} of {len(frame)} bytes")
            os.fdatasync(self._fd)
        except OSError:
            # Cut back to the last whole frame: a torn frame left in place would make recovery stop
            # there and drop every later change, though each of those was fsynced whole.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self.journal_bytes)
            raise
        self.journal_bytes += len(frame)
        self.appended += 1

    def wants_compaction(self) -> bool:
        return self.journal_bytes > max(self.snapshot_bytes, self.min_compact_bytes)

    def compact(
        self,
        served: Iterable[TopicPartitionKey],
        epochs: Mapping[TopicPartitionKey, EpochMark] | None = None,
        controller_epoch: int = 0,
    ) -> None:
        """Write ``served`` as the snapshot of the next generation and start an empty journal of it.

        Crash-safe in every order: until the new snapshot's rename, the old snapshot and journal stand;
        after it, the old journal's generation no longer matches and is ignored."""
        generation = self.generation + 1
        snapshot = encode_frame(
            {
                "generation": generation,
                "served": sorted(served),
                "epochs": [mark.to_json(key) for key, mark in sorted((epochs or {}).items())],
                "controller_epoch": controller_epoch,
            }
        )
        header = encode_frame({"generation": generation})
        _replace(self.snapshot_path, snapshot)
        # The snapshot's rename must be durable before the journal's: the other way round, a crash
        # could leave the old snapshot with an empty journal of the new generation, losing changes.
        _fsync_dir(self.data_dir)
        _replace(self.journal_path, header)
        _fsync_dir(self.data_dir)
        with contextlib.suppress(FileNotFoundError):
            self.legacy_path.unlink()
        self.close()
        self._fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND)
        self.generation = generation
        self.snapshot_bytes = len(snapshot)
        self.journal_bytes = len(header)
        self.appended = 0
        self.compactions += 1

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
