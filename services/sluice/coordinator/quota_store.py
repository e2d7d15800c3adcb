"""Client quotas in Redis (docs/quotas.md, docs/redis-schema.md).

Keys (``<p>`` = the coordinator's key prefix):

- ``<p>:quotas``          - hash: ``<kind>:<name>`` -> the entity's limits as canonical JSON;
- ``<p>:quotas:version``  - INCR on every change; brokers and dispatchers hold a copy at a version
  and ask for a new one when it moves (WatchQuotas).

As with the ACLs (``acl_store.py``), every change is one Lua script that checks the coordinator
epoch first (a deposed coordinator changes nothing), and a read takes the version and the hash in one
script, so a snapshot's version names exactly its quotas.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from sluice.errors import NotCoordinator, StorageError
from sluice.quotas.model import Kind, Limits, QuotaKey, QuotaSnapshot, Resource

__all__ = ["QuotaStore"]

# KEYS[1] epoch, KEYS[2] hash, KEYS[3] version; ARGV[1] epoch, then (field, value) pairs: value ""
# deletes the field. Answers {'OK', version, changed} or {'FENCED', epoch}.
_CHANGE = """
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then
  return {'FENCED', current or ''}
end
local changed = 0
for i = 2, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    changed = changed + redis.call('HDEL', KEYS[2], ARGV[i])
  elseif redis.call('HGET', KEYS[2], ARGV[i]) ~= ARGV[i + 1] then
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
    changed = changed + 1
  end
end
local version
if changed > 0 then
  version = redis.call('INCR', KEYS[3])
else
  version = tonumber(redis.call('GET', KEYS[3]) or '0')
end
return {'OK', tostring(version), changed}
"""

_SNAPSHOT = """
return {redis.call('GET', KEYS[1]) or '0', redis.call('HGETALL', KEYS[2])}
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _field(key: QuotaKey) -> str:
    return f"{key.kind.value}:{key.name}"


def _encode(limits: Limits) -> str:
    return json.dumps(limits.to_dict(), sort_keys=True, separators=(",", ":"))


def _decode(field: str, value: str) -> tuple[QuotaKey, Limits]:
    try:
        kind, _, name = field.partition(":")
        data = json.loads(value)
        limits = Limits(**{r.value: float(data.get(r.value, 0)) for r in Resource})
        return QuotaKey(Kind(kind), name), limits
    except (ValueError, TypeError, AttributeError) as exc:
        # Never skipped: a skipped quota would lift a limit someone set.
        raise StorageError(
            f"undecodable quota {field!r}={value!r} in Redis ({exc}); remove it with HDEL"
        ) from exc


class QuotaStore:
    """Set, delete and read quotas; writes are fenced by the coordinator epoch."""

    def __init__(self, redis: Redis, key_prefix: str) -> None:
        self._redis = redis
        self.epoch_key = f"{key_prefix}:coordinator:epoch"
        self.quotas_key = f"{key_prefix}:quotas"
        self.version_key = f"{key_prefix}:quotas:version"
        self._change = redis.register_script(_CHANGE)
        self._snapshot = redis.register_script(_SNAPSHOT)

    async def alter(self, epoch: int, quotas: Mapping[QuotaKey, Limits]) -> tuple[int, int]:
        """Replace the limits of each entity (empty limits: delete it). Returns (changed, version)."""
        args: list[str] = []
        for key, limits in quotas.items():
            args += [_field(key), "" if limits.empty else _encode(limits)]
        return await self._run(epoch, args)

    async def delete(self, epoch: int, keys: Iterable[QuotaKey]) -> tuple[int, int]:
        args: list[str] = []
        for key in keys:
            args += [_field(key), ""]
        return await self._run(epoch, args)

    async def load(self) -> QuotaSnapshot:
        try:
            version, flat = await self._snapshot(keys=[self.version_key, self.quotas_key])
        except RedisError as exc:
            raise StorageError(f"cannot read the quotas from Redis: {exc}") from exc
        pairs = [_text(x) for x in flat]
        quotas = dict(_decode(f, v) for f, v in zip(pairs[::2], pairs[1::2], strict=True))
        return QuotaSnapshot(quotas, int(_text(version)))

    async def version(self) -> int:
        try:
            raw = await self._redis.get(self.version_key)
        except RedisError as exc:
            raise StorageError(f"cannot read the quota version from Redis: {exc}") from exc
        return int(raw) if raw is not None else 0

    async def _run(self, epoch: int, args: list[str]) -> tuple[int, int]:
        if not args:
            return 0, await self.version()
        try:
            reply = await self._change(
                keys=[self.epoch_key, self.quotas_key, self.version_key], args=[str(epoch), *args]
            )
        except RedisError as exc:
            raise StorageError(f"quota change in Redis failed: {exc}") from exc
        if _text(reply[0]) == "FENCED":
            raise NotCoordinator(
                f"this coordinator (epoch {epoch}) was superseded by coordinator epoch "
                f"{_text(reply[1]) or '?'}; send requests to the current coordinator"
            )
        return int(reply[2]), int(_text(reply[1]))
