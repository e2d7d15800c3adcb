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


def partition_field(topic: str, partition: int) -> str:
    """The hash field of one partition: ``topic/partition``."""
    return f"{topic}/{partition}"


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

    def group_patterns(self, group: str) -> tuple[str, str]:
        """SCAN patterns matching every key of one group: the coordinator's (``grp``) and the offsets
        (``off``, every track and member). Group names hold no glob characters (validated)."""
        prefix = "".join("\\" + c if c in "*?[]\\" else c for c in self.prefix)
        return f"{prefix}:grp:{{{group}}}:*", f"{prefix}:off:{{{group}}}:*"

    # ---- push cursors (owned here) ----
    def cursor(self, subscription: str, topic: str, partition: int) -> str:
        """string: the encoded cursor (see cursor_codec)."""
        return f"{self.prefix}:cur:{{{subscription}}}:{topic}/{partition}"

    def cursor_epoch(self, subscription: str, topic: str, partition: int) -> str:
        """string: owner epoch of the dispatcher allowed to write the cursor."""
        return self.cursor(subscription, topic, partition) + ":epoch"

    # ---- the registry of durable push subscriptions (owned here) ----
    def subscriptions(self) -> str:
        """hash ``topic/subscription`` -> ``type|created_ms|last_active_ms|filter`` (see subscriptions.py)."""
        return f"{self.prefix}:subs"
