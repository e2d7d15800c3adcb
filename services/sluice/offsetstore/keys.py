"""The Redis key layout of docs/redis-schema.md, in one place.

Braces around a group or subscription name are literal Redis Cluster hash tags
(``sluice:grp:{orders}:members``): every key of one group, or of one
subscription, hashes to one slot, so a single Lua script may touch them all.
Names never contain ``:``, ``/``, ``{`` or ``}`` (they are validated as
``[A-Za-z0-9._-]``), so no name can forge another key.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TRACK = "default"

# How the topic's purge (``TOPIC_PURGE_LUA``) removes what a key holds of the topic; the value of the
# key's field in ``Keys.topic_refs``. One letter, then (for an index) the prefix of the keys it lists.
REF_FIELDS = "h"  # a hash with ``topic/partition`` fields among others': delete the topic's fields
REF_KEY = "k"  # a key holding nothing but the topic's data: delete it
REF_INDEX = "i"  # a set of member ids, ``i<prefix>``: drop the ids whose hash ``<prefix><id>`` is gone


def partition_field(topic: str, partition: int) -> str:
    """The hash field of one partition: ``topic/partition``."""
    return f"{topic}/{partition}"


def topic_field_prefix(topic: str) -> str:
    """The prefix of every hash field of ``topic`` (names never contain ``/``, so ``a/`` is not ``ab/``)."""
    return f"{topic}/"


def split_field(field: str) -> tuple[str, int]:
    topic, _, partition = field.rpartition("/")
    return topic, int(partition)


@dataclass(frozen=True)
class Keys:
    prefix: str = "sluice"

    # ---- group ownership (written by the coordinator, read here) ----
    def members(self, group: str) -> str:
        """hash member_id -> current member epoch."""
        return f"{self.prefix}:grp:{{{group}}}:members"

    def owners(self, group: str, track: str = DEFAULT_TRACK) -> str:
        """hash ``topic/partition`` -> member_id owning it on ``track``.

        A partition has one owner per offset track: under the ``split`` conflict
        policy two members may each own it, on different tracks.
        """
        base = f"{self.prefix}:grp:{{{group}}}:owners"
        return base if track == DEFAULT_TRACK else f"{base}:{track}"

    def live(self, group: str) -> str:
        """string: number of live members."""
        return f"{self.prefix}:grp:{{{group}}}:live"

    # ---- committed offsets (owned here) ----
    def offsets(self, group: str, track: str) -> str:
        """hash ``topic/partition`` -> next offset to consume, for one track."""
        return f"{self.prefix}:off:{{{group}}}:{track}"

    def leader_epochs(self, group: str, track: str) -> str:
        """hash ``topic/partition`` -> the leader epoch committed with the offset (KIP-320). A hash of its
        own beside the offsets, so every reader of offsets reads what it always did."""
        return f"{self.offsets(group, track)}:le"

    def handover(self, group: str, track: str) -> str:
        """hash ``topic/partition`` -> the offset a filter's binding to ``track`` started from (its
        handover: docs/groups.md). Written by the coordinator, read by DescribeGroup."""
        return f"{self.offsets(group, track)}:handover"

    def member_offsets_prefix(self, group: str, track: str) -> str:
        return f"{self.offsets(group, track)}:m:"

    def member_offsets(self, group: str, track: str, member_id: str) -> str:
        """hash: broadcasting model, one member's offsets."""
        return self.member_offsets_prefix(group, track) + member_id

    def member_index(self, group: str, track: str) -> str:
        """set of member ids that have per-member offsets (so a reset can clear them).

        Not in redis-schema.md yet: an offset-store-private index next to the
        per-member hashes it lists.
        """
        return f"{self.offsets(group, track)}:members"

    # ---- topic identity (written by the coordinator; read and extended here) ----
    def topic_id(self, topic: str) -> str:
        """string: the ``topic_id`` of the topic's current incarnation; absent while no topic has the name.

        Every write of a position checks the writer's ``topic_id`` against it in the same script, so a
        writer still holding a deleted topic's position cannot write it into a re-created one.
        """
        return f"{self.prefix}:topic:{{{topic}}}:id"

    def topic_refs(self, topic: str) -> str:
        """hash: key -> ``REF_*`` for every key that holds data of the topic (offsets, cursors, ...).

        Each script that writes such a key registers it here in the same call, so deleting the topic can
        remove exactly that data, atomically with the topic record, without a SCAN.
        """
        return f"{self.prefix}:topic:{{{topic}}}:refs"

    def member_hash_prefix(self, index_key: str) -> str:
        """The prefix of the per-member hashes a ``member_index`` key lists (``<prefix><member_id>``)."""
        return index_key.removesuffix(":members") + ":m:"

    def group_patterns(self, group: str) -> tuple[str, str]:
        """SCAN patterns matching every key of one group: the coordinator's (``grp``) and the offsets
        (``off``, every track and member). Group names hold no glob characters (validated)."""
        prefix = "".join("\\" + c if c in "*?[]\\" else c for c in self.prefix)
        return f"{prefix}:grp:{{{group}}}:*", f"{prefix}:off:{{{group}}}:*"

    # ---- push cursors (owned here) ----
    def cursor(self, subscription: str, topic: str, partition: int) -> str:
        """string: the encoded cursor (see cursor_codec)."""
        return f"{self.prefix}:cur:{{{subscription}}}:{topic}/{partition}"

    def cursor_topic(self, key: str) -> str:
        """The topic of a ``cursor`` or ``cursor_epoch`` key (``{P}:cur:{S}:T/p[:epoch]``)."""
        return key.partition("}:")[2].partition("/")[0]

    def cursor_epoch(self, subscription: str, topic: str, partition: int) -> str:
        """string: owner epoch of the dispatcher allowed to write the cursor."""
        return self.cursor(subscription, topic, partition) + ":epoch"

    # ---- the registry of durable push subscriptions (owned here) ----
    def subscriptions(self) -> str:
        """hash ``topic/subscription`` -> ``type|created_ms|last_active_ms|filter`` (see subscriptions.py)."""
        return f"{self.prefix}:subs"


#: Lua: remove every registered piece of one topic's data, then the registry itself.
#: ``refs`` is the registry key, ``fprefix`` the topic's field prefix (``topic_field_prefix``).
#: Shared by the coordinator's delete (inside its fenced write) so that the layout stays defined here.
TOPIC_PURGE_LUA = f"""
local function purge_topic(refs, fprefix)
  local entries = redis.call('HGETALL', refs)
  local indexes = {{}}
  for j = 1, #entries, 2 do
    local key, how = entries[j], entries[j + 1]
    local kind = string.sub(how, 1, 1)
    if kind == '{REF_KEY}' then
      redis.call('DEL', key)
    elseif kind == '{REF_FIELDS}' then
      for _, f in ipairs(redis.call('HKEYS', key)) do
        if string.sub(f, 1, #fprefix) == fprefix then redis.call('HDEL', key, f) end
      end
    elseif kind == '{REF_INDEX}' then
      indexes[#indexes + 1] = {{key, string.sub(how, 2)}}
    end
  end
  for _, ix in ipairs(indexes) do
    for _, m in ipairs(redis.call('SMEMBERS', ix[1])) do
      if redis.call('EXISTS', ix[2] .. m) == 0 then redis.call('SREM', ix[1], m) end
    end
  end
  redis.call('DEL', refs)
end
"""
