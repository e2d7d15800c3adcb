"""Request validation: pure functions that raise typed errors, no I/O.

Malformed requests fail as a whole with an error naming the bad item, because
they are client bugs; refusals that depend on Redis state (fencing, ownership)
are per item and decided in the Lua scripts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sluice.common.names import MAX_PARTITIONS, validate_group, validate_topic
from sluice.errors import InvalidArgument, InvalidRequest, echo
from sluice.offsetstore.keys import DEFAULT_TRACK
from sluice.offsetstore.model import CursorKey, OffsetCommit, ResetRequest, ResetSpec, TopicPartition
from sluice.offsetstore.subscriptions import SubscriptionRecord

# Request size limits. A request above them is a client bug or an attack; the
# limits sit far above what a real consumer or dispatcher sends.
MAX_COMMIT_PARTITIONS = 10_000
MAX_FETCH_PARTITIONS = 10_000
MAX_RESET_PARTITIONS = MAX_PARTITIONS
MAX_CURSORS_PER_SAVE = 1_000
# Acked-range values (2 per range) over all cursors of one SaveCursors: 2M ranges.
MAX_RANGE_VALUES_PER_SAVE = 4_000_000
MAX_REDELIVERIES_PER_SAVE = 1_000_000

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1

# Member ids are chosen by the coordinator; accept any short printable token.
_MEMBER_ID = re.compile(r"[\x21-\x7e]{1,255}")


def track_name(track: str) -> str:
    """An empty track is the group's ``default`` offset track."""
    return validate_group(track, "track") if track else DEFAULT_TRACK


def validate_member_id(member_id: str) -> str:
    if not _MEMBER_ID.fullmatch(member_id):
        raise InvalidArgument(
            f"invalid member_id {echo(member_id)}: use the 1-255 printable, non-space characters the "
            "coordinator assigned in the heartbeat response"
        )
    return member_id


def validate_partition(partition: int, where: str) -> int:
    if not 0 <= partition < MAX_PARTITIONS:
        raise InvalidArgument(f"{where}: partition {partition} is out of range (0..{MAX_PARTITIONS - 1})")
    return partition


def validate_offset(offset: int, where: str) -> int:
    if not 0 <= offset <= INT64_MAX:
        raise InvalidArgument(
            f"{where}: offset {offset} is negative; an offset is the next position to consume, 0 or more"
        )
    return offset


# Topic ids are the coordinator's uuid4().hex; accept any short token so the check stays the store's.
_TOPIC_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")


def validate_topic_id(topic_id: str, where: str) -> str:
    """ "" (unchecked) or a plausible topic id (the coordinator's ``Metadata`` gives it)."""
    if topic_id and not _TOPIC_ID.fullmatch(topic_id):
        raise InvalidArgument(
            f"{where}: invalid topic_id {echo(topic_id)}: send Metadata's topic_id, or none"
        )
    return topic_id


def _check_size(count: int, limit: int, what: str) -> None:
    if count > limit:
        raise InvalidRequest(f"too many {what} in one request ({count}); at most {limit}: split the request")


def validate_commit(group: str, member_id: str, member_epoch: int, commits: Sequence[OffsetCommit]) -> None:
    validate_group(group)
    validate_member_id(member_id)
    if not 0 <= member_epoch <= INT32_MAX:
        raise InvalidArgument(f"member_epoch {member_epoch} is invalid: use the epoch of your last heartbeat")
    _check_size(len(commits), MAX_COMMIT_PARTITIONS, "partition offsets")
    for i, c in enumerate(commits):
        where = f"offsets[{i}] ({c.topic}/{c.partition})"
        validate_topic(c.topic)
        validate_partition(c.partition, where)
        validate_offset(c.offset, where)
        track_name(c.track)
        validate_topic_id(c.topic_id, where)


def validate_fetch(group: str, track: str, partitions: Sequence[TopicPartition], member_id: str) -> None:
    validate_group(group)
    track_name(track)
    if member_id:
        validate_member_id(member_id)
    _check_size(len(partitions), MAX_FETCH_PARTITIONS, "partitions")
    for i, tp in enumerate(partitions):
        validate_topic(tp.topic)
        validate_partition(tp.partition, f"partitions[{i}]")


def validate_reset(request: ResetRequest) -> None:
    validate_group(request.group)
    track_name(request.track)
    if not request.targets and not request.all_topics:
        raise InvalidArgument("name the topics to reset (topic or topics), or ask for all_topics")
    _check_size(sum(len(parts) for _, parts in request.targets), MAX_RESET_PARTITIONS, "partitions")
    seen: set[str] = set()
    for topic, partitions in request.targets:
        validate_topic(topic)
        if topic in seen:
            raise InvalidArgument(f"topic {topic!r} is listed twice: give its partitions once")
        seen.add(topic)
        for i, p in enumerate(partitions):
            validate_partition(p, f"{topic} partitions[{i}]")
        if len(set(partitions)) != len(partitions):
            raise InvalidArgument(f"partitions of {topic!r} list a partition twice")
    if request.spec is ResetSpec.OFFSET:
        validate_offset(request.value, "reset")
    elif request.spec is ResetSpec.TIMESTAMP and request.value < 0:
        raise InvalidArgument(
            f"reset timestamp {request.value} is negative: give milliseconds since the epoch"
        )


def validate_cursor_key(key: CursorKey, where: str) -> None:
    validate_group(key.subscription, "subscription")
    validate_topic(key.topic)
    validate_partition(key.partition, where)


def validate_cursor_batch(count: int, range_values: int, redeliveries: int) -> None:
    """Size limits of one SaveCursors (per-cursor content is checked by the codec)."""
    _check_size(count, MAX_CURSORS_PER_SAVE, "cursors")
    _check_size(range_values, MAX_RANGE_VALUES_PER_SAVE, "acked-range values")
    _check_size(redeliveries, MAX_REDELIVERIES_PER_SAVE, "redelivery counts")


def validate_owner_epoch(epoch: int, where: str) -> int:
    if not 0 <= epoch <= INT64_MAX:
        raise InvalidArgument(f"{where}: owner_epoch {epoch} is negative")
    return epoch


def validate_subscription_record(record: SubscriptionRecord, where: str) -> None:
    validate_group(record.subscription, "subscription")
    validate_topic(record.topic)
    if record.type < 0 or record.created_ms < 0 or record.last_active_ms < 0:
        raise InvalidArgument(f"{where} ({record.field}): type and times must be >= 0")
    if len(record.filter) > 4096:
        raise InvalidArgument(f"{where} ({record.field}): the filter is longer than 4096 characters")
    validate_topic_id(record.topic_id, f"{where} ({record.field})")
