"""The coordinator's metadata store in Redis: one hash of records, written atomically and fenced by epoch.

Keys (``<p>`` = key_prefix, default ``sluice``):

- ``<p>:coordinator:records`` - hash, field ``<TYPE>:<id>`` -> encoded record (see ``records.py``);
- ``<p>:coordinator:epoch``   - the epoch of the coordinator allowed to write.

Every write runs one Lua script: it checks that the epoch key still holds the writer's epoch and then applies
all of a handler's records (HSET, or HDEL for a tombstone) and the key operations derived from them (the
group ownership keys the offset store reads, ``groups/redis_ops.py``), so they land all together or not
at all, and a deposed coordinator (a zombie after a network partition, or an old process still draining)
cannot write a single one. Today a starting coordinator takes the next epoch with INCR (fencing any older
process); the leader election of the next issue plugs in at :meth:`MetadataStore.acquire_epoch`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from sluice.coordinator.ops import RedisOp
from sluice.coordinator.records import Record, RecordCodec, RecordValue
from sluice.errors import NotCoordinator, NotEnoughReplicas, StorageError
from sluice.offsetstore.keys import TOPIC_PURGE_LUA
from sluice.offsetstore.storage import ReplicaWait

log = logging.getLogger(__name__)

# KEYS[1] epoch key, KEYS[2] records hash, then every other key an operation names.
# ARGV[1] the writer's epoch, then per operation: op, key index, a, b:
#   HSET key a=field b=value | HDEL key a=field | SET key a=value | DEL key
#   HCOPY key a=index of the source hash b=field (copy the field, or delete it when the source has none)
#   PURGE key=a topic's refs a=the topic's field prefix (remove every registered piece of its data).
#   DELINDEX key=a set of member ids a=the prefix of their hashes b=index of a topic's refs hash or ''
#     (delete each listed member's hash, and unregister it from those refs; the set itself stays).
# Records are HSET/HDEL on KEYS[2].
FENCED_WRITE = (
    TOPIC_PURGE_LUA
    + """
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then
  return {'FENCED', current or ''}
end
for i = 2, #ARGV, 4 do
  local op, key = ARGV[i], KEYS[tonumber(ARGV[i + 1])]
  if op == 'HSET' then
    redis.call('HSET', key, ARGV[i + 2], ARGV[i + 3])
  elseif op == 'HDEL' then
    redis.call('HDEL', key, ARGV[i + 2])
  elseif op == 'SET' then
    redis.call('SET', key, ARGV[i + 2])
  elseif op == 'DEL' then
    redis.call('DEL', key)
  elseif op == 'HCOPY' then
    local v = redis.call('HGET', KEYS[tonumber(ARGV[i + 2])], ARGV[i + 3])
    if v then redis.call('HSET', key, ARGV[i + 3], v) else redis.call('HDEL', key, ARGV[i + 3]) end
  elseif op == 'PURGE' then
    purge_topic(key, ARGV[i + 2])
  elseif op == 'DELINDEX' then
    local refs = nil
    if ARGV[i + 3] ~= '' then refs = KEYS[tonumber(ARGV[i + 3])] end
    for _, id in ipairs(redis.call('SMEMBERS', key)) do
      redis.call('DEL', ARGV[i + 2] .. id)
      if refs then redis.call('HDEL', refs, ARGV[i + 2] .. id) end
    end
  else
    return redis.error_reply('unknown operation ' .. op)
  end
end
return {'OK', current}
"""
)


# KEYS[1] the epoch key, ARGV[1] the floor.
RAISE_EPOCH = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return current
"""


class MetadataStore:
    """Loads and writes the coordinator's records. Caller: the service layer only."""

    def __init__(
        self, redis: Redis, key_prefix: str, codec: RecordCodec, wait: ReplicaWait | None = None
    ) -> None:
        self._redis = redis
        #: ``--metadata-replicas``: each write is followed by ``WAIT`` on the same connection.
        self._wait = wait or ReplicaWait()
        self._codec = codec
        self.epoch_key = f"{key_prefix}:coordinator:epoch"
        self.records_key = f"{key_prefix}:coordinator:records"
        #: Written by ``barrier`` only (its value: the writer's epoch; nothing reads it).
        self.barrier_key = f"{key_prefix}:coordinator:replicated"
        self._write = redis.register_script(FENCED_WRITE)

    async def barrier(self, epoch: int) -> None:
        """With ``--metadata-replicas``: return once the replicas hold everything written so far, else
        raise NotEnoughReplicas. A tiny fenced write and its ``WAIT``: replication is one ordered stream,
        so replicas that hold this write hold every write before it, including one that was refused
        because its own ``WAIT`` timed out. Without the setting: nothing."""
        if self._wait.replicas:
            await self.write(epoch, (), [RedisOp("SET", self.barrier_key, str(epoch))])

    async def acquire_epoch(self) -> int:
        """Become the writer: take the next coordinator epoch (INCR), fencing every older coordinator.

        The leader-election hook: with an election, only the elected leader calls this, after winning.
        """
        try:
            return int(await self._redis.incr(self.epoch_key))
        except RedisError as exc:
            raise StorageError(f"cannot reach the metadata store (Redis): {exc}") from exc

    async def raise_epoch(self, floor: int) -> None:
        """Make the coordinator epoch at least ``floor`` (never lower it): the next ``acquire_epoch`` (or
        election) then takes an epoch above every one the brokers have obeyed. Fences the caller too."""
        try:
            await self._redis.eval(RAISE_EPOCH, 1, self.epoch_key, floor)
        except RedisError as exc:
            raise StorageError(f"cannot reach the metadata store (Redis): {exc}") from exc

    async def current_epoch(self) -> int:
        raw = await self._redis.get(self.epoch_key)
        return int(raw) if raw is not None else 0

    async def load(self) -> list[RecordValue]:
        """Every stored record, decoded (undecodable records raise StorageError: never start on them)."""
        try:
            raw = await self._redis.hgetall(self.records_key)
        except RedisError as exc:
            raise StorageError(f"cannot load coordinator metadata from Redis: {exc}") from exc
        records = []
        for field, value in raw.items():
            name = field.decode() if isinstance(field, bytes) else str(field)
            records.append(
                self._codec.decode(name, value if isinstance(value, bytes) else str(value).encode())
            )
        return records

    async def write(self, epoch: int, records: Sequence[Record], ops: Sequence[RedisOp] = ()) -> None:
        """Persist ``records`` and apply ``ops`` atomically if ``epoch`` is still the current coordinator
        epoch.

        Raises NotCoordinator when fenced (nothing written) and StorageError when Redis fails (the outcome
        is then unknown: the caller must reload its state before the next write).
        """
        if not records and not ops:
            return
        keys = [self.epoch_key, self.records_key]
        index = {self.records_key: 2}

        def key_index(key: str) -> str:
            i = index.get(key)
            if i is None:
                keys.append(key)
                i = index[key] = len(keys)
            return str(i)

        args: list[str | bytes] = [str(epoch)]
        for record in records:
            field, value = self._codec.encode(record)
            if value is None:
                args += ["HDEL", "2", field, ""]
            else:
                args += ["HSET", "2", field, value]
        for op in ops:
            a = key_index(op.a) if op.op == "HCOPY" else op.a
            b = key_index(op.b) if op.op == "DELINDEX" and op.b else op.b
            args += [op.op, key_index(op.key), a, b]
        try:
            reply, replicas = await self._write_and_wait(keys, args)
        except ResponseError as exc:
            raise StorageError(f"metadata write refused by Redis: {exc}") from exc
        except RedisError as exc:
            raise StorageError(f"metadata write to Redis failed: {exc}") from exc
        status = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        if status == "FENCED":
            holder = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
            raise NotCoordinator(
                f"this coordinator (epoch {epoch}) was superseded by coordinator epoch {holder or '?'}; "
                "send requests to the current coordinator"
            )
        wait = self._wait
        if wait.replicas and replicas < wait.replicas:
            raise NotEnoughReplicas(
                f"metadata written on the Redis primary but held by {replicas} of the {wait.replicas} "
                f"replicas asked for (--metadata-replicas) within {wait.timeout_ms} ms: a failover could "
                "lose it, so it is not acted on; retry"
            )

    async def _write_and_wait(self, keys: list[str], args: list[str | bytes]) -> tuple[Any, int]:
        """The fenced write, then (with ``--metadata-replicas``) ``WAIT`` in the same pipeline: one
        connection (WAIT counts that connection's writes) and no extra round trip. Returns the script's
        reply and how many replicas acknowledged (0 when not asked)."""
        if not self._wait.replicas:
            return await self._write(keys=keys, args=args), 0
        async with self._redis.pipeline(transaction=False) as pipe:
            await self._write(keys=keys, args=args, client=pipe)
            pipe.execute_command("WAIT", self._wait.replicas, self._wait.timeout_ms)
            reply, replicas = await pipe.execute()
        return reply, int(replicas)
