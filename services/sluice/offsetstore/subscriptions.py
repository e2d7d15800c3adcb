"""The registry of durable push subscriptions: one Redis hash, ``{P}:subs``.

A durable subscription lives until an operator deletes it (docs/dispatcher.md, "Idle subscriptions"),
so the dispatchers record each one here when they load it and touch it as consumers come and go; any
dispatcher (a restarted one, another replica) lists idle subscriptions from here.

Field ``topic/subscription`` (names never contain ``/`` or ``|``), value
``type|created_ms|last_active_ms|filter``: the filter goes last because it may contain ``|``
(``a || b``). A plain string rather than JSON keeps Lua exact: Lua's cjson prints numbers with 14
significant digits. The registry hash is one key, in its own Redis Cluster slot; deleting a
subscription removes its cursors first (one script in the subscription's slot) and then its entry,
so a crash between the two leaves a visible entry to delete again, never invisible cursors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from sluice.offsetstore.keys import REF_FIELDS, Keys
from sluice.offsetstore.topic_identity import TOPIC_CHECK_LUA, TopicRefusal
from sluice.v1 import common_pb2

__all__ = ["SubscriptionRecord", "SubscriptionRegistry"]

# KEYS[1] the registry hash, then two keys per topic: its id key and its refs hash.
# ARGV: quadruples (index into KEYS of the topic's id key, field, "type|created|last_active|filter",
#   the toucher's topic_id or ""). Keeps the stored created_ms and the larger last_active_ms
#   (dispatchers touch concurrently). A record whose topic is gone or another incarnation now is not
#   written (topic identity: docs/redis-schema.md); a written one registers the registry hash in the
#   topic's refs (its fields are ``topic/subscription``), so deleting the topic removes it.
# Returns per record: NONE, or the topic refusal's code and the topic's current id (flattened pairs).
TOUCH = (
    TOPIC_CHECK_LUA
    + f"""
local out = {{}}
for i = 1, #ARGV, 4 do
  local t, field, value, given = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local current = redis.call('GET', KEYS[t])
  local code = topic_code(current, given)
  if code == {common_pb2.NONE} then
    local ty, c, a, f = string.match(value, '^(%d+)|(%d+)|(%d+)|(.*)$')
    local cur = redis.call('HGET', KEYS[1], field)
    if cur then
      local _, oc, oa = string.match(cur, '^(%d+)|(%d+)|(%d+)|')
      if oc and tonumber(oc) > 0 then c = oc end
      if oa and tonumber(oa) > tonumber(a) then a = oa end
    end
    redis.call('HSET', KEYS[1], field, ty .. '|' .. c .. '|' .. a .. '|' .. f)
    redis.call('HSETNX', KEYS[t + 1], KEYS[1], '{REF_FIELDS}')
  end
  out[#out + 1] = code
  out[#out + 1] = current or ''
end
return out
"""
)

# KEYS: the cursor and cursor-epoch keys of one subscription (one hash slot), then the topic's refs
# hash, where they are unregistered (nothing left to purge). Returns keys removed.
DELETE_CURSORS = """
local n = 0
for i = 1, #KEYS - 1 do
  n = n + redis.call('DEL', KEYS[i])
  redis.call('HDEL', KEYS[#KEYS], KEYS[i])
end
return n
"""


@dataclass(frozen=True, slots=True)
class SubscriptionRecord:
    topic: str
    subscription: str
    type: int
    filter: str
    created_ms: int
    last_active_ms: int
    #: The incarnation the toucher loaded the subscription for (not stored; "" = unchecked).
    topic_id: str = ""

    @property
    def field(self) -> str:
        return f"{self.topic}/{self.subscription}"

    def encode(self) -> str:
        return f"{self.type}|{self.created_ms}|{self.last_active_ms}|{self.filter}"

    @classmethod
    def decode(cls, field: str, value: str) -> SubscriptionRecord | None:
        topic, _, subscription = field.partition("/")
        parts = value.split("|", 3)
        if len(parts) != 4 or not subscription:
            return None
        try:
            return cls(topic, subscription, int(parts[0]), parts[3], int(parts[1]), int(parts[2]))
        except ValueError:
            return None


class SubscriptionRegistry:
    """Storage of the registry. Redis errors propagate (the caller maps them to StorageError)."""

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self._redis = client
        self._keys = keys
        self._touch = client.register_script(TOUCH)
        self._delete = client.register_script(DELETE_CURSORS)

    async def touch(self, records: Sequence[SubscriptionRecord]) -> list[TopicRefusal | None]:
        """Record ``records``; per record None, or the refusal of its topic (then it was not written)."""
        if not records:
            return []
        k = self._keys
        keys = [k.subscriptions()]
        topic_index: dict[str, int] = {}
        argv: list[str | int] = []
        for r in records:
            t = topic_index.get(r.topic)
            if t is None:
                t = topic_index[r.topic] = len(keys) + 1
                keys += [k.topic_id(r.topic), k.topic_refs(r.topic)]
            argv += [t, r.field, r.encode(), r.topic_id]
        raw = await self._touch(keys=keys, args=argv)
        out: list[TopicRefusal | None] = []
        for i in range(len(records)):
            code = int(raw[2 * i])
            out.append(None if code == common_pb2.NONE else TopicRefusal(code, _text(raw[2 * i + 1])))
        return out

    async def list(self, topic: str = "") -> list[SubscriptionRecord]:
        raw = await self._redis.hgetall(self._keys.subscriptions())
        out = []
        for field, value in raw.items():
            rec = SubscriptionRecord.decode(_text(field), _text(value))
            if rec is not None and (not topic or rec.topic == topic):
                out.append(rec)
        return sorted(out, key=lambda r: (r.topic, r.subscription))

    async def delete(self, topic: str, subscription: str, partitions: Sequence[int], unregister: bool) -> int:
        """Remove the cursors of ``partitions`` (one script: one slot), then the registry entry."""
        k = self._keys
        keys: list[str] = []
        for p in partitions:
            keys += [k.cursor(subscription, topic, p), k.cursor_epoch(subscription, topic, p)]
        removed = int(await self._delete(keys=[*keys, k.topic_refs(topic)], args=[])) if keys else 0
        if unregister:
            removed += int(await self._redis.hdel(k.subscriptions(), f"{topic}/{subscription}"))
        return removed


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
