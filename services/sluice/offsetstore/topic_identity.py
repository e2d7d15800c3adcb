"""Topic identity at the offset store: how a write refused for its topic is reported. Pure.

Every position write carries the writer's ``topic_id``; the Lua scripts compare it with the topic's id key
(docs/redis-schema.md, "Topic identity") and answer a :class:`TopicRefusal` when it is not the current
incarnation (or, without an id, when no topic has the name). This module turns those answers into the
typed errors the RPCs return.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.errors import SluiceError, UnknownTopicId, UnknownTopicOrPartition
from sluice.v1 import common_pb2

__all__ = ["TOPIC_CHECK_LUA", "TopicRefusal", "parse_save_result", "topic_error"]

#: Lua ``topic_code(current, given)``: the topic check of every script that writes per-topic state.
TOPIC_CHECK_LUA = f"""
-- The topic check of every position write: the writer's topic_id (ARGV, '' when the writer sent
-- none) against the topic's current one (its id key). Returns NONE, or the refusal's code.
local function topic_code(current, given)
  if not current then
    if given == '' then return {common_pb2.UNKNOWN_TOPIC_OR_PARTITION} end
    return {common_pb2.UNKNOWN_TOPIC_ID}
  end
  if given ~= '' and given ~= current then return {common_pb2.UNKNOWN_TOPIC_ID} end
  return {common_pb2.NONE}
end
"""


@dataclass(frozen=True, slots=True)
class TopicRefusal:
    """A write refused for its topic: ``code`` UNKNOWN_TOPIC_ID or UNKNOWN_TOPIC_OR_PARTITION, and the
    topic's current id ("" when no topic has the name)."""

    code: int
    current_id: str


def topic_error(refusal: TopicRefusal, topic: str, given: str, what: str) -> SluiceError:
    """The typed refusal of a write whose topic is gone or is another incarnation now."""
    if refusal.code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION:
        return UnknownTopicOrPartition(f"{what}: topic {topic!r} does not exist", topic=topic)
    now = f"it was re-created with topic_id {refusal.current_id}" if refusal.current_id else "it was deleted"
    return UnknownTopicId(
        f"{what}: topic {topic!r} is not the incarnation {given} any more: {now}. The position belongs "
        "to the old topic and was not written; re-read the metadata and start again from the new topic",
        topic=topic,
        topic_id=given,
        current_topic_id=refusal.current_id,
    )


def parse_save_result(raw: str) -> int | TopicRefusal | None:
    """One cursor's answer of the SAVE_CURSORS script: None (written), the epoch that fenced it, or the
    refusal for its topic."""
    if not raw:
        return None
    if raw[0] == "E":
        return int(raw[1:])
    code, _, current = raw[1:].partition(":")
    return TopicRefusal(int(code), current)
