"""The leader-epoch cache of one partition log: epoch -> the offset its leader's first batch got.

Kafka's ``LeaderEpochFileCache`` and its ``leader-epoch-checkpoint``. Every batch carries the
leader epoch it was appended in; this cache keeps, per epoch, the first offset of that epoch, so a
replica can answer ``OffsetForLeaderEpoch`` (``end_offset_for``) without scanning the log, and a
follower can find exactly where its log diverged from a new leader's (KIP-101, KIP-279).

Entries are strictly increasing in epoch and in start offset. The file is rewritten whole (atomic
replace: temporary file, fsync, rename, fsync the directory): at once by a truncation, at the
log's next flush after an append began a new epoch (never on the produce path). It carries a
CRC32C, so bit rot is detected and the cache is rebuilt from the segments' batch headers
(``rebuild``), as when the file is missing or older than the log.

File format (little-endian)::

    8 bytes   b"SLEPOCH1"
    u32       entry count
    entries   i32 epoch, i64 start_offset
    u32       CRC32C of everything before it

Caller: ``PartitionLog``, under its lock. Decisions: docs/replication.md, "Leader epochs in the log".
"""

from __future__ import annotations

import itertools
import logging
import struct
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from pathlib import Path

from sluice.broker.log.durable import replace_durably
from sluice.broker.log.handles import storage_error
from sluice.codec.batch import crc32c

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "leader-epoch-checkpoint"
_MAGIC = b"SLEPOCH1"
_COUNT = struct.Struct("<I")
_ENTRY = struct.Struct("<iq")
_CRC = struct.Struct("<I")
#: Kafka's answers when no epoch fits: the requested epoch is unknown here.
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochCache:
    """Epoch -> start offset, in memory as two parallel lists, persisted on every change."""

    __slots__ = ("_epochs", "_starts", "_write_lock", "_written", "path", "version")

    def __init__(self, directory: Path) -> None:
        self.path = directory / CHECKPOINT_FILE
        self._epochs: list[int] = []
        self._starts: list[int] = []
        #: Bumped by every change; a write of an older version than the file's is skipped, so a
        #: flush (another thread) never puts back what a truncation replaced meanwhile.
        self.version = 0
        self._written = -1
        self._write_lock = threading.Lock()

    # ---- reading and writing the file -----------------------------------------------

    def load(self) -> bool:
        """Read the checkpoint; False (and an empty cache) if it is missing or fails its checks."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.warning("cannot read %s (%s): rebuilding it from the log", self.path, exc)
            return False
        entries = _decode(raw)
        if entries is None:
            log.warning("%s is corrupt (checksum or format): rebuilding it from the log", self.path)
            return False
        epochs = [e for e, _ in entries]
        starts = [s for _, s in entries]
        if any(b <= a for a, b in itertools.pairwise(epochs)) or any(
            b <= a for a, b in itertools.pairwise(starts)
        ):
            log.warning("%s is not monotonic: rebuilding it from the log", self.path)
            return False
        self._epochs, self._starts = epochs, starts
        self._written = self.version  # the file holds what the cache holds
        return True

    def rebuild(self, batch_epochs: Iterable[tuple[int, int]]) -> None:
        """Recompute the cache from ``(base_offset, leader_epoch)`` of every batch in log order,
        and persist it. Batches without an epoch (-1) add nothing. An empty log with no file
        writes none: creating a partition costs no extra fsync."""
        self._epochs, self._starts = [], []
        self.version += 1
        for base_offset, epoch in batch_epochs:
            if epoch >= 0 and (not self._epochs or epoch > self._epochs[-1]):
                self._epochs.append(epoch)
                self._starts.append(base_offset)
        if self._epochs or self.path.exists():
            self.persist()

    def encode(self) -> tuple[bytes, int]:
        """The checkpoint file's bytes for the cache as it is now, and its version."""
        body = _MAGIC + _COUNT.pack(len(self._epochs))
        body += b"".join(_ENTRY.pack(e, s) for e, s in zip(self._epochs, self._starts, strict=True))
        return body + _CRC.pack(crc32c(body)), self.version

    def write(self, data: bytes, version: int) -> None:
        """Atomically replace the file with ``data`` (write, fsync, rename, fsync the directory),
        unless a newer version is already there."""
        with self._write_lock:
            if version <= self._written:
                return
            self._write(data)
            self._written = version

    def _write(self, data: bytes) -> None:
        try:
            replace_durably(self.path, data)
        except OSError as exc:
            raise storage_error(f"writing {self.path}", exc) from exc

    def persist(self) -> None:
        self.write(*self.encode())

    # ---- queries --------------------------------------------------------------------

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts, strict=True))

    @property
    def latest_epoch(self) -> int:
        """The highest epoch in the log; UNDEFINED_EPOCH if none."""
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    def start_offset_of(self, epoch: int) -> int | None:
        i = bisect_left(self._epochs, epoch)
        return self._starts[i] if i < len(self._epochs) and self._epochs[i] == epoch else None

    def end_offset_for(self, requested: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch answer: ``(epoch, end_offset)``.

        - the latest epoch: ``(it, log_end_offset)`` (KIP-279: a new leader's epoch ends at its LEO);
        - between known epochs: the largest epoch <= ``requested`` and the start offset of the next
          higher epoch (where this log stopped being in agreement with that epoch);
        - below the first epoch: ``(requested, start of the first epoch)``, as Kafka: the asker
          holds data this log no longer has (or never had) and must truncate to where this log's
          known history starts;
        - above the latest epoch, ``UNDEFINED_EPOCH`` asked, or an empty cache:
          ``(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)``.
        """
        if requested == UNDEFINED_EPOCH or not self._epochs or requested > self._epochs[-1]:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested == self._epochs[-1]:
            return requested, log_end_offset
        higher = bisect_right(self._epochs, requested)
        if higher == 0:
            return requested, self._starts[0]
        return self._epochs[higher - 1], self._starts[higher]

    # ---- changes (each persisted) ---------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset`` (an append in a new epoch); True if it
        changed the cache. Kafka's rule: entries not below it in both epoch and start offset go
        first (a leader elected twice with nothing appended in between keeps only the later).

        Not written here: the log writes the file at its next flush, off the produce path
        (``PartitionLog.flush``); a checkpoint a crash left behind the log is found at open,
        its latest epoch differing from the log's last batch's, and rebuilt."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"epoch {epoch} / start offset {start_offset} must be >= 0")
        if self._epochs and epoch == self._epochs[-1] and start_offset >= self._starts[-1]:
            return False
        while self._epochs and (self._epochs[-1] >= epoch or self._starts[-1] >= start_offset):
            self._epochs.pop()
            self._starts.pop()
        self._epochs.append(epoch)
        self._starts.append(start_offset)
        self.version += 1
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was cut to ``end_offset``: forget epochs that start at or after it."""
        keep = bisect_left(self._starts, end_offset)
        if keep < len(self._starts):
            del self._epochs[keep:], self._starts[keep:]
            self.version += 1
            self.persist()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at ``start_offset`` (retention): epochs that ended before it go, and
        the one it falls in starts there."""
        i = bisect_right(self._starts, start_offset) - 1
        if i < 0 or (i == 0 and self._starts[0] == start_offset):
            return
        del self._epochs[:i], self._starts[:i]
        self._starts[0] = start_offset
        self.version += 1
        self.persist()

    def clear(self) -> None:
        self._epochs, self._starts = [], []
        self.version += 1
        self.persist()


def _decode(raw: bytes) -> list[tuple[int, int]] | None:
    head = len(_MAGIC) + _COUNT.size
    if len(raw) < head + _CRC.size or not raw.startswith(_MAGIC):
        return None
    (count,) = _COUNT.unpack_from(raw, len(_MAGIC))
    if len(raw) != head + count * _ENTRY.size + _CRC.size:
        return None
    (crc,) = _CRC.unpack_from(raw, len(raw) - _CRC.size)
    if crc32c(raw[: -_CRC.size]) != crc:
        return None
    return [_ENTRY.unpack_from(raw, head + i * _ENTRY.size) for i in range(count)]
