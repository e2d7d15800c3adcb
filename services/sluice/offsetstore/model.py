"""Domain objects of the offset store: what the servicer builds from protobuf
and what the service and storage layers speak. No I/O here."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sluice.errors import SluiceError
from sluice.offsetstore.cursor_codec import CursorState


@dataclass(frozen=True, slots=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}"


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    """One partition's position in a commit. ``track`` is already defaulted."""

    topic: str
    partition: int
    offset: int
    track: str
    #: The topic incarnation the offset was read from ("": unchecked, only the topic must exist).
    topic_id: str = ""
    #: The leader epoch the records before ``offset`` were fetched under (-1: unknown). KIP-320.
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class CommitOutcome:
    """The per-partition result: the offset now stored (-1 if none) or the refusal."""

    topic: str
    partition: int
    offset: int
    error: SluiceError | None = None


class MessageModel(enum.Enum):
    CLUSTERING = "clustering"
    BROADCASTING = "broadcasting"


class ResetSpec(enum.Enum):
    OFFSET = 0
    EARLIEST = 1
    LATEST = 2
    TIMESTAMP = 3
    SHIFT = 4


@dataclass(frozen=True, slots=True)
class ResetRequest:
    group: str
    #: (topic, partitions); empty partitions: every partition of the topic.
    targets: tuple[tuple[str, tuple[int, ...]], ...]
    spec: ResetSpec
    #: The offset (OFFSET), a timestamp in ms (TIMESTAMP) or a signed delta (SHIFT).
    value: int
    track: str
    #: Also every topic the group has committed offsets for on ``track``.
    all_topics: bool = False
    #: Resolve and report only; write nothing.
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class ResetOutcome:
    """One partition of a reset: the committed offset before (-1: none) and the one set."""

    topic: str
    partition: int
    previous: int
    offset: int
    #: "" (inside the log), "log_start" or "log_end": the target was clamped to that bound.
    clamped: str = ""
    #: -1 when not looked up (an explicit offset without a coordinator to ask).
    log_start_offset: int = -1
    log_end_offset: int = -1


@dataclass(frozen=True, slots=True)
class CursorKey:
    subscription: str
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.subscription}@{self.topic}/{self.partition}"


@dataclass(frozen=True, slots=True)
class CursorWrite:
    """One cursor of a SaveCursors batch, with its owner epoch."""

    key: CursorKey
    owner_epoch: int
    state: CursorState
    #: The topic incarnation the cursor belongs to ("": unchecked, only the topic must exist).
    topic_id: str = ""


@dataclass(frozen=True, slots=True)
class StoredCursor:
    key: CursorKey
    owner_epoch: int
    state: CursorState
    stored_bytes: int
