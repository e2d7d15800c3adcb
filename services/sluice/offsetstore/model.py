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


@dataclass(frozen=True, slots=True)
class ResetRequest:
    group: str
    topic: str
    partitions: tuple[int, ...]  # empty: every partition of the topic
    spec: ResetSpec
    value: int  # the offset (OFFSET) or a timestamp in ms (TIMESTAMP)
    track: str


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
