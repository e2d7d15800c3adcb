"""Producer ids for idempotent producers: unique across coordinators and restarts, and rationed per client.

**Unique.** Ids are handed out from blocks of :data:`BLOCK_SIZE` that the coordinator leader reserves in Redis
with one fenced script: it checks the coordinator epoch key (as every metadata write does, store.py) and moves
the counter on. A deposed leader cannot reserve a block, two leaders can never hold the same block, and a
restarted coordinator starts at a fresh block (the rest of the old one is skipped: ids are 63 bits, so a
wasted block costs nothing). When Redis has replicas the reservation waits for one (``WAIT``): a Sentinel
failover that lost the reservation would otherwise hand the same block out twice.

**Rationed** (KIP-936). Every new id becomes state on every partition the producer writes to, kept until it
expires (broker/log/producer_state.py). A client that makes producers in a loop (a Spark job creating one per
task, a bug) would fill those tables and evict the state of well-behaved producers. So each client id may take
at most ``per_minute`` new ids a minute (a token bucket, so a burst up to that size passes); more is refused
with the retriable ``THROTTLED`` naming the wait. Re-initialising an id (a new epoch for an id the client
already has) is not rationed: it adds no entry anywhere. The buckets are bounded too (least recently used
clients are forgotten beyond :data:`MAX_TRACKED_CLIENTS`; a forgotten client starts with a full bucket).
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from sluice.common.names import validate_client_id
from sluice.common.rate import BucketMap
from sluice.errors import InvalidArgument, NotCoordinator, StorageError, Throttled, echo

BLOCK_SIZE = 1000
#: Producer epochs are i16 in the batch header; past the last one the producer gets a new id.
MAX_PRODUCER_EPOCH = 2**15 - 1
MAX_TRACKED_CLIENTS = 10_000
DEFAULT_PER_MINUTE = 600

# KEYS[1] coordinator epoch key, KEYS[2] next-block counter; ARGV[1] the caller's epoch, ARGV[2] block size.
# Returns the first id of the reserved block, or {'FENCED', current epoch}.
_RESERVE = """
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then
  return {'FENCED', current or ''}
end
local next = redis.call('INCRBY', KEYS[2], ARGV[2])
return {'OK', tostring(next - tonumber(ARGV[2]))}
"""


@dataclass(frozen=True, slots=True)
class ProducerIdentity:
    producer_id: int
    producer_epoch: int


class ProducerIdBlocks:
    """Reserves blocks of ids in Redis and hands them out one by one. One event loop uses it."""

    def __init__(self, redis: Redis, key_prefix: str, epoch_key: str) -> None:
        self._redis = redis
        self._epoch_key = epoch_key
        self._counter_key = f"{key_prefix}:coordinator:producer-ids"
        self._reserve = redis.register_script(_RESERVE)
        self._next = 0
        self._end = 0  # exclusive; equal to _next when the block is used up (or none is held)

    def forget(self) -> None:
        """Drop the held block (a new term: never reuse a block reserved under an older epoch)."""
        self._next = self._end = 0

    async def next_id(self, epoch: int) -> int:
        if self._next >= self._end:
            first = await self._reserve_block(epoch)
            self._next, self._end = first, first + BLOCK_SIZE
        producer_id = self._next
        self._next += 1
        return producer_id

    async def _reserve_block(self, epoch: int) -> int:
        try:
            status, value = await self._reserve(
                keys=[self._epoch_key, self._counter_key], args=[str(epoch), BLOCK_SIZE]
            )
            if _text(status) == "FENCED":
                raise NotCoordinator(
                    f"this coordinator (epoch {epoch}) was superseded by epoch {_text(value) or '?'}"
                )
            replicas = int((await self._redis.info("replication")).get("connected_slaves", 0))
            if replicas and int(await self._redis.wait(1, 2000)) < 1:
                raise StorageError("producer ids reserved, but no Redis replica confirmed it: retry")
        except RedisError as exc:
            raise StorageError(f"cannot reserve producer ids in Redis: {exc}") from exc
        return int(_text(value))


class ProducerIdQuota:
    """At most ``per_minute`` new producer ids per client id, as a token bucket (bursts up to that size)."""

    def __init__(self, per_minute: int = DEFAULT_PER_MINUTE, max_clients: int = MAX_TRACKED_CLIENTS) -> None:
        if per_minute <= 0:
            raise ValueError("per_minute must be positive")
        self.per_minute = per_minute
        self._buckets: BucketMap[str] = BucketMap(per_minute / 60, float(per_minute), max_clients)

    def admit(self, client_id: str, now_ms: int) -> None:
        """Take one token for ``client_id``, or raise ``Throttled`` saying how long to wait."""
        bucket = self._buckets.get(client_id, now_ms / 1000)
        wait_s = bucket.wait_s(now_ms / 1000)
        if wait_s > 0:
            raise Throttled(
                f"client {echo(client_id)} asked for more than {self.per_minute} new producer ids a minute: "
                f"retry in {int(wait_s * 1000) + 1} ms "
                "(reuse one producer per process rather than one per task)"
            )
        bucket.spend(1, now_ms / 1000)


async def init_producer_id(
    blocks: ProducerIdBlocks,
    quota: ProducerIdQuota,
    epoch: int,
    client_id: str,
    current: ProducerIdentity | None,
    now_ms: int,
) -> ProducerIdentity:
    """A new identity, or ``current`` under the next epoch (which fences the older instance on every
    partition it wrote to); a new id once the epochs are used up."""
    if current is not None:
        if current.producer_id < 0 or not 0 <= current.producer_epoch <= MAX_PRODUCER_EPOCH:
            raise InvalidArgument(
                f"producer id {current.producer_id} epoch {current.producer_epoch}: "
                "give both (to bump the epoch) or neither (for a new id)"
            )
        if current.producer_epoch < MAX_PRODUCER_EPOCH:
            return ProducerIdentity(current.producer_id, current.producer_epoch + 1)
    quota.admit(validate_client_id(client_id), now_ms)
    return ProducerIdentity(await blocks.next_id(epoch), 0)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
