"""Leader election on Redis (``sluice up``, or any deployment outside Kubernetes).

The lease is one key, ``<prefix>:coordinator:leader``, holding JSON ``{identity, address, epoch,
duration_ms, acquired_ms, renewed_ms, renewals}`` with a TTL of the lease duration (PX): Redis itself
expires a lease that stops being renewed. Three Lua scripts keep every step atomic:

- **acquire**: if the key is still what the candidate observed (absent, for a normal election; the exact
  old value, for taking over a dead predecessor's lease at our own address), ``INCR
  <prefix>:coordinator:epoch`` and write the record with the new epoch. That epoch is the fencing token
  ``MetadataStore.write`` checks, so winning the lease and fencing every older leader are one step: from
  that instant a deposed leader's metadata writes are refused by the store's own Lua fence;
- **renew**: if the key still holds our identity *and* epoch, rewrite it with a fresh TTL;
- **release**: if the key still holds our identity and epoch, delete it (a standby takes over at once).

``*_ms`` times are the holder's wall clock, for people reading the key; the election never compares them
(followers time expiry on their own monotonic clock, see machine.py, and Redis enforces the TTL).
"""

from __future__ import annotations

import json
import time
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from sluice.coordinator.election.base import Candidate
from sluice.coordinator.election.loop import Clock, ElectionLoop
from sluice.coordinator.election.machine import ElectionTiming, LeaseRecord
from sluice.errors import StorageError

__all__ = ["RedisElector", "RedisLeaseStore", "epoch_key", "leader_key"]

# KEYS[1] leader key, KEYS[2] epoch key.
# ARGV[1] the value observed ('' = the key must be absent), ARGV[2] identity, ARGV[3] address,
# ARGV[4] lease duration ms (the TTL), ARGV[5] wall-clock ms.
ACQUIRE = """
local current = redis.call('GET', KEYS[1])
if ARGV[1] == '' then
  if current then return {0, current} end
elseif current ~= ARGV[1] then
  return {0, current or ''}
end
local epoch = redis.call('INCR', KEYS[2])
local record = cjson.encode({identity = ARGV[2], address = ARGV[3], epoch = epoch,
  duration_ms = tonumber(ARGV[4]), acquired_ms = tonumber(ARGV[5]), renewed_ms = tonumber(ARGV[5]),
  renewals = 0})
redis.call('SET', KEYS[1], record, 'PX', ARGV[4])
return {1, record}
"""

# KEYS[1] leader key. ARGV[1] identity, ARGV[2] epoch, ARGV[3] lease duration ms, ARGV[4] wall-clock ms.
RENEW = """
local current = redis.call('GET', KEYS[1])
if not current then return {0, ''} end
local rec = cjson.decode(current)
if rec.identity ~= ARGV[1] or rec.epoch ~= tonumber(ARGV[2]) then return {0, current} end
rec.renewed_ms = tonumber(ARGV[4])
rec.renewals = (rec.renewals or 0) + 1
local record = cjson.encode(rec)
redis.call('SET', KEYS[1], record, 'PX', ARGV[3])
return {1, record}
"""

# KEYS[1] leader key. ARGV[1] identity, ARGV[2] epoch.
RELEASE = """
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
local rec = cjson.decode(current)
if rec.identity ~= ARGV[1] or rec.epoch ~= tonumber(ARGV[2]) then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""


def leader_key(key_prefix: str) -> str:
    return f"{key_prefix}:coordinator:leader"


def epoch_key(key_prefix: str) -> str:
    """The coordinator epoch key: the same one ``MetadataStore`` fences every write against."""
    return f"{key_prefix}:coordinator:epoch"


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def decode_record(raw: str) -> LeaseRecord:
    try:
        data = json.loads(raw)
        return LeaseRecord(
            holder=str(data["identity"]),
            address=str(data["address"]),
            epoch=int(data["epoch"]),
            duration=int(data["duration_ms"]) / 1000.0,
            version=raw,
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise StorageError(
            f"the coordinator leader record in Redis is corrupt ({exc!r}): {raw[:200]!r}"
        ) from exc


class RedisLeaseStore:
    """The ``LeaseStore`` on one Redis key. Caller: ``RedisElector`` (and tests)."""

    def __init__(self, redis: Redis, key_prefix: str, wall_ms: Clock | None = None) -> None:
        self._redis = redis
        self.leader_key = leader_key(key_prefix)
        self.epoch_key = epoch_key(key_prefix)
        self._wall_ms = wall_ms or (lambda: time.time() * 1000)
        self._acquire = redis.register_script(ACQUIRE)
        self._renew = redis.register_script(RENEW)
        self._release = redis.register_script(RELEASE)

    async def read(self) -> LeaseRecord | None:
        try:
            raw = await self._redis.get(self.leader_key)
        except RedisError as exc:
            raise StorageError(f"cannot read the leader key from Redis: {exc}") from exc
        return None if raw is None else decode_record(_text(raw))

    async def acquire(
        self, expected: LeaseRecord | None, candidate: Candidate
    ) -> tuple[bool, LeaseRecord | None]:
        ttl_ms = max(1, round(candidate.lease_duration * 1000))
        args = [
            expected.version if expected is not None else "",
            candidate.identity,
            candidate.address,
            ttl_ms,
            int(self._wall_ms()),
        ]
        reply = await self._script(self._acquire, [self.leader_key, self.epoch_key], args, "acquire")
        return self._outcome(reply)

    async def renew(self, held: LeaseRecord) -> tuple[bool, LeaseRecord | None]:
        ttl_ms = max(1, round(held.duration * 1000))
        args = [held.holder, held.epoch, ttl_ms, int(self._wall_ms())]
        reply = await self._script(self._renew, [self.leader_key], args, "renew")
        return self._outcome(reply)

    async def release(self, held: LeaseRecord) -> None:
        await self._script(self._release, [self.leader_key], [held.holder, held.epoch], "release")

    async def close(self) -> None:
        """The Redis client belongs to the caller."""

    @staticmethod
    def _outcome(reply: Any) -> tuple[bool, LeaseRecord | None]:
        won = int(reply[0]) == 1
        raw = _text(reply[1]) if reply[1] else ""
        return won, decode_record(raw) if raw else None

    @staticmethod
    async def _script(script: Any, keys: list[str], args: list[Any], what: str) -> Any:
        try:
            return await script(keys=keys, args=args)
        except RedisError as exc:
            raise StorageError(f"leader {what} in Redis failed: {exc}") from exc


class RedisElector(ElectionLoop):
    """``Elector`` on Redis. The epoch it hands to ``on_elected`` is the new value of the epoch key."""

    backend = "redis"

    def __init__(
        self,
        redis: Redis,
        key_prefix: str,
        identity: str,
        address: str,
        timing: ElectionTiming,
        *,
        clock: Clock = time.monotonic,
    ) -> None:
        self.lease_store = RedisLeaseStore(redis, key_prefix)
        super().__init__(self.lease_store, identity, address, timing, clock=clock)
