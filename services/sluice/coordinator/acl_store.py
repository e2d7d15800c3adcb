"""The ACLs in Redis, and the security version every change bumps (docs/redis-schema.md, "Security").

Keys (``<p>`` = the coordinator's key prefix):

- ``<p>:security:acls``    - set of entries, each its canonical JSON (``AclEntry.to_dict``, sorted keys), so
  an entry is stored once however often it is added;
- ``<p>:security:version`` - the security version: INCR on every change of the ACLs (and of users: the
  user store bumps it through :meth:`AclStore.bump_version`). Services hold a copy at a version and ask
  for a new snapshot when it moves (WatchSecurity).

Every change is one Lua script: it checks the coordinator epoch (as every metadata write does, store.py, so a
deposed coordinator cannot change a single ACL), applies the change and bumps the version only if something
changed, all at once. Reads take the version and the entries in one script too, so a snapshot's version
always names exactly its entries. Everything is in Redis: a restarted coordinator serves the same ACLs at the
same version.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from sluice.errors import InvalidArgument, NotCoordinator, StorageError
from sluice.security.acl import AclEntry, AclFilter, AclSet

__all__ = ["AclStore", "acls_key", "version_key"]

# KEYS[1] the coordinator epoch key, KEYS[2] the ACL set, KEYS[3] the version; ARGV[1] the writer's epoch,
# ARGV[2] 'add' or 'remove', then the members. Answers {'OK', version, {changed members}} or {'FENCED', epoch}
# (nested tables: unpack() of thousands of members would overflow Lua's stack).
_CHANGE = """
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then
  return {'FENCED', current or ''}
end
local changed = {}
for i = 3, #ARGV do
  local n
  if ARGV[2] == 'add' then
    n = redis.call('SADD', KEYS[2], ARGV[i])
  else
    n = redis.call('SREM', KEYS[2], ARGV[i])
  end
  if n == 1 then changed[#changed + 1] = ARGV[i] end
end
local version
if #changed > 0 then
  version = redis.call('INCR', KEYS[3])
else
  version = tonumber(redis.call('GET', KEYS[3]) or '0')
end
return {'OK', tostring(version), changed}
"""

# KEYS[1] the version, KEYS[2] the ACL set: {version, {members}} read together.
_SNAPSHOT = """
return {redis.call('GET', KEYS[1]) or '0', redis.call('SMEMBERS', KEYS[2])}
"""

# KEYS[1] the coordinator epoch key, KEYS[2] the version; ARGV[1] the writer's epoch.
_BUMP = """
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then
  return {'FENCED', current or ''}
end
return {'OK', tostring(redis.call('INCR', KEYS[2]))}
"""


def acls_key(key_prefix: str) -> str:
    return f"{key_prefix}:security:acls"


def version_key(key_prefix: str) -> str:
    return f"{key_prefix}:security:version"


def _encode(entry: AclEntry) -> str:
    return json.dumps(entry.to_dict(), sort_keys=True, separators=(",", ":"))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _decode(member: Any) -> AclEntry:
    """A stored entry. One that does not decode fails the read (StorageError), never skipped: a skipped
    DENY would grant what it refused."""
    text = _text(member)
    try:
        return AclEntry.from_dict(json.loads(text))
    except (ValueError, TypeError, InvalidArgument) as exc:
        raise StorageError(f"undecodable ACL entry {text!r} in Redis ({exc}); remove it with SREM") from exc


class AclStore:
    """Add, remove and list ACLs; read the version. Caller: the coordinator's Acls servicer.

    Writes take the writer's coordinator epoch and are refused (NOT_COORDINATOR) unless it is current.
    """

    def __init__(self, redis: Redis, key_prefix: str) -> None:
        self._redis = redis
        self.epoch_key = f"{key_prefix}:coordinator:epoch"
        self.acls_key = acls_key(key_prefix)
        self.version_key = version_key(key_prefix)
        self._change = redis.register_script(_CHANGE)
        self._snapshot = redis.register_script(_SNAPSHOT)
        self._bump = redis.register_script(_BUMP)

    async def add(self, epoch: int, entries: Iterable[AclEntry]) -> tuple[list[AclEntry], int]:
        """Store ``entries``; returns those that were new and the version after."""
        return await self._apply(epoch, "add", [_encode(e) for e in entries])

    async def remove(self, epoch: int, filters: Sequence[AclFilter]) -> tuple[list[AclEntry], int]:
        """Remove every entry a filter matches; returns those removed and the version after.

        The matching is done here on a snapshot and the script removes exactly those members: an entry
        added meanwhile by another request is not removed (as in Kafka: a delete is of what it saw)."""
        current = await self.load()
        doomed = [e for e in current if any(f.matches(e) for f in filters)]
        return await self._apply(epoch, "remove", [_encode(e) for e in doomed])

    async def load(self) -> AclSet:
        """Every entry at the current version, read together."""
        try:
            reply = await self._snapshot(keys=[self.version_key, self.acls_key])
        except RedisError as exc:
            raise StorageError(f"cannot read the ACLs from Redis: {exc}") from exc
        version, members = reply
        return AclSet((_decode(m) for m in members), int(_text(version)))

    async def version(self) -> int:
        try:
            raw = await self._redis.get(self.version_key)
        except RedisError as exc:
            raise StorageError(f"cannot read the security version from Redis: {exc}") from exc
        return int(raw) if raw is not None else 0

    async def bump_version(self, epoch: int) -> int:
        """Move the version on without an ACL change (a user store's change: services must re-read the
        user generations). Fenced like every write; returns the new version."""
        reply = await self._run(self._bump, [self.epoch_key, self.version_key], epoch)
        return int(_text(reply[1]))

    async def _apply(self, epoch: int, op: str, members: list[str]) -> tuple[list[AclEntry], int]:
        if not members:
            return [], await self.version()
        reply = await self._run(
            self._change, [self.epoch_key, self.acls_key, self.version_key], epoch, op, *members
        )
        changed = [_decode(m) for m in reply[2]]
        return changed, int(_text(reply[1]))

    async def _run(self, script: Any, keys: list[str], epoch: int, *args: str) -> list[Any]:
        try:
            reply = await script(keys=keys, args=[str(epoch), *args])
        except RedisError as exc:
            raise StorageError(f"ACL change in Redis failed: {exc}") from exc
        if _text(reply[0]) == "FENCED":
            raise NotCoordinator(
                f"this coordinator (epoch {epoch}) was superseded by coordinator epoch "
                f"{_text(reply[1]) or '?'}; send requests to the current coordinator"
            )
        return list(reply)
