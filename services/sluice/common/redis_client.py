"""The one way a Sluice service connects to Redis: a plain address or a Sentinel-managed primary.

Addresses:

- ``redis://host:port/db``, ``rediss://...`` (TLS), ``unix:///path?db=N``: one Redis server.
- ``redis+sentinel://host:port[,host:port...]/service_name[/db]``: ask these Sentinels where the primary
  of ``service_name`` is, and ask again whenever a connection to it fails (redis-py's Sentinel support). The
  credentials in the address (``redis+sentinel://sluice:secret@h:26379/mymaster``, a Redis ACL user, or
  ``:secret@`` for the default user) are the data nodes'; the Sentinels are asked without any unless the
  address ends in ``?sentinel_auth=yes``, which presents the same user and password to them (Sentinels
  with ``requirepass`` or ACL users, as the chart runs them).

Credentials: a Redis ACL user and password in the address (``redis://sluice:secret@host:6379/0``); TLS with
``rediss://`` and redis-py's own query options (``?ssl_ca_certs=/path/ca.crt``,
``ssl_certfile``/``ssl_keyfile`` for a client certificate). docs/security.md, "Redis", is the reference.

Why a URL form and not extra flags: every service already takes one ``--redis-url`` (and a ``*_REDIS_URL``
environment variable in the chart), so following a Sentinel-managed Redis is a value change, not a new
setting per service.

After a failover, a connection to the old primary fails (it is gone, or answers READONLY as a replica,
which redis-py turns into a connection error for a Sentinel-managed pool) and the next attempt reconnects
through the Sentinels. What a failover can lose (Redis replicates asynchronously) and the guard against it
(``WAIT``) are in docs/offset-store.md, "Redis failover".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sluice.common.log_limit import RateLimitedWarning
from sluice.errors import CommitOutcomeUnknown, InvalidArgument, StorageError

log = logging.getLogger(__name__)

SENTINEL_SCHEME = "redis+sentinel"
#: How long one Redis command may take before it fails (the socket timeout). Well under the SDK's request
#: timeouts (10-30 s), so a paused or stalled Redis gives a retriable answer the client still gets, and
#: far above a healthy command (a Lua commit is well under a millisecond, plus an fsync with
#: ``appendfsync always``). docs/offset-store.md, "When Redis is down or slow".
SOCKET_TIMEOUT = 3.0
_PLAIN_SCHEMES = ("redis", "rediss", "unix")
#: A pooled connection idle this long is PINGed before use, so one broken by a Redis restart is replaced
#: before a command is sent on it (which would otherwise fail, in doubt, and need a retry).
HEALTH_CHECK_INTERVAL = 2
#: Commands in flight at once per client (each holds a pooled connection). redis-py 8 lowered the
#: asyncio pool's default to 100 and refuses the 101st concurrent command ("Too many connections"): a
#: hundred push subscriptions loading their cursors at once hit it. What bounds a service's concurrency
#: is its gRPC server's concurrent-RPC limit; this only keeps the pool from refusing below it, with room
#: under Redis's default maxclients (10,000) for every service of a cluster.
MAX_CONNECTIONS = 1024


@dataclass(frozen=True, slots=True)
class SentinelAddress:
    sentinels: tuple[tuple[str, int], ...]
    service_name: str
    db: int
    password: str | None
    username: str | None = None
    #: Present ``username``/``password`` to the Sentinels too (``?sentinel_auth=yes``).
    sentinel_auth: bool = False


_YES, _NO = ("yes", "true", "1"), ("no", "false", "0")


def _sentinel_auth(url: str, query: str) -> bool:
    options = parse_qs(query, keep_blank_values=True)
    unknown = set(options) - {"sentinel_auth"}
    if unknown:
        raise InvalidArgument(f"{url!r}: unknown option {sorted(unknown)[0]!r} (known: sentinel_auth)")
    value = options.get("sentinel_auth", ["no"])[-1].lower()
    if value not in _YES + _NO:
        raise InvalidArgument(f"{url!r}: sentinel_auth must be yes or no, got {value!r}")
    return value in _YES


def parse_sentinel_url(url: str) -> SentinelAddress:
    """``redis+sentinel://h1:26379,h2:26379/mymaster/0`` → its parts; InvalidArgument when malformed."""
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        raise InvalidArgument(f"{url!r} is not a {SENTINEL_SCHEME}:// address")
    auth, _, hosts = parts.netloc.rpartition("@")
    user, _, secret = auth.partition(":")
    username, password = unquote(user) or None, unquote(secret) or None
    sentinels: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgument(f"{url!r}: expected host:port for every Sentinel, got {item!r}")
        sentinels.append((host, int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise InvalidArgument(f"{url!r}: expected /service_name or /service_name/db after the Sentinels")
    if len(path) == 2 and not path[1].isdigit():
        raise InvalidArgument(f"{url!r}: the database must be a number, got {path[1]!r}")
    sentinel_auth = _sentinel_auth(url, parts.query)
    if sentinel_auth and password is None:
        raise InvalidArgument(f"{url!r}: sentinel_auth=yes needs a password in the address")
    db = int(path[1]) if len(path) == 2 else 0
    return SentinelAddress(tuple(sentinels), path[0], db, password, username, sentinel_auth)


def validate_url(url: str, flag: str = "--redis-url") -> None:
    """Refuse an address no scheme here understands, naming the flag."""
    scheme = urlsplit(url).scheme
    if scheme == SENTINEL_SCHEME:
        parse_sentinel_url(url)
        return
    if scheme not in _PLAIN_SCHEMES:
        raise InvalidArgument(
            f"{flag} {url!r}: expected redis://, rediss://, unix:// or {SENTINEL_SCHEME}://host:port,.../service"
        )


def connect(
    url: str,
    *,
    socket_timeout: float = SOCKET_TIMEOUT,
    connect_timeout: float = 2.0,
    retries: int = 3,
) -> aioredis.Redis:
    """A client that survives a Redis restart or a Sentinel failover.

    Commands fail fast while Redis is down, after a short retry that covers the common cases: one broken
    pooled connection, or a primary that just moved (the retry reconnects through the Sentinels).
    ``retries=0`` for a client whose writes must be classified exactly (the offset store's: see
    :func:`redis_errors`): with a retry, a write sent and lost followed by a refused reconnect would read
    as "never sent". Only connection errors are retried, never timeouts: a timeout means Redis is slow or
    paused (``CLIENT PAUSE``), and a resend would only queue the same command again behind the pause.
    """
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=retries)
    retry_on: list[type[RedisError]] = [RedisConnectionError]
    if urlsplit(url).scheme != SENTINEL_SCHEME:
        validate_url(url)
        return aioredis.Redis.from_url(
            url,
            decode_responses=False,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            retry=retry,
            retry_on_error=retry_on,
            health_check_interval=HEALTH_CHECK_INTERVAL,
            max_connections=MAX_CONNECTIONS,
        )
    address = parse_sentinel_url(url)
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": connect_timeout,
        "socket_connect_timeout": connect_timeout,
    }
    if address.sentinel_auth:
        sentinel_kwargs.update(username=address.username, password=address.password)
    sentinel = Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves its __init__ unannotated
        list(address.sentinels), sentinel_kwargs=sentinel_kwargs
    )
    client: aioredis.Redis = sentinel.master_for(
        address.service_name,
        db=address.db,
        username=address.username,
        password=address.password,
        decode_responses=False,
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
        retry=retry,
        retry_on_error=retry_on,
        health_check_interval=HEALTH_CHECK_INTERVAL,
        max_connections=MAX_CONNECTIONS,
    )
    return client


# ---- Redis down or slow (docs/offset-store.md, "When Redis is down or slow") ---------------------------


def never_sent(exc: RedisError) -> bool:
    """True when ``exc`` proves the command did not run: Redis answered with an error (``LOADING`` after a
    restart, ``BUSY``, ``READONLY``, ``MASTERDOWN``, ``OOM``, ``NOPERM``), or the connection could not be
    opened. A connection lost or a read timed out after the command was sent is not proof: the command
    may have run (a command sent to a Redis under ``CLIENT PAUSE`` runs when the pause ends)."""
    if isinstance(exc, ResponseError | BusyLoadingError):
        return True
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return "connecting to" in str(exc)  # redis-py's wording for a failed connect, before any send
    return False


@asynccontextmanager
async def redis_errors(what: str, warn: RateLimitedWarning, *, write: bool = False) -> AsyncIterator[None]:
    """Turn a Redis failure into a retriable typed error naming the operation.

    A write that may have run (:func:`never_sent` false) is ``CommitOutcomeUnknown``: the caller must not
    take it as stored, and must not take it as refused either; a retry is safe because every write of the
    offset store is idempotent (commits only increase, cursors are fenced by epoch). Anything else is
    ``StorageError``. Both are gRPC ``UNAVAILABLE``.
    """
    try:
        yield
    except RedisError as exc:
        warn.failed(what, exc)
        if write and not never_sent(exc):
            raise CommitOutcomeUnknown(
                f"Redis did not answer while {what} ({exc}): it may or may not have been applied; retry "
                "(it is idempotent)"
            ) from exc
        raise StorageError(f"storage unavailable while {what}: {exc}") from exc
    warn.succeeded()


async def wait_for_redis(client: aioredis.Redis, service: str) -> None:
    """Return once Redis answers a PING; until then back off (0.2 s doubling to 5 s) with a rate-limited
    warning. For a service that cannot start without Redis: waiting beats exiting and being restarted in a
    loop by its supervisor (docs/offset-store.md, "When Redis is down or slow")."""
    warn = RateLimitedWarning(log)
    delay = 0.2
    while True:
        try:
            await client.ping()
        except RedisError as exc:
            warn.failed(f"{service} starts (waiting for it)", exc)
        else:
            warn.succeeded()
            return
        await asyncio.sleep(delay)
        delay = min(delay * 2, 5.0)


# ---- maxmemory-policy -----------------------------------------------------------------------------------

NOEVICTION = "noeviction"


async def require_noeviction(client: aioredis.Redis, service: str) -> bool:
    """Refuse a Redis that may evict keys: eviction would silently delete committed offsets, cursors and
    the coordinator's metadata. True when checked; False when it could not be checked because ``CONFIG``
    is renamed away or not allowed to this ACL user (warned: refusing would make such setups unusable,
    and the operator who locked ``CONFIG`` down owns its settings). Raises InvalidArgument for any other
    policy, StorageError when Redis cannot be reached."""
    try:
        reply = await client.config_get("maxmemory-policy")
    except ResponseError as exc:  # unknown command (rename-command CONFIG ""), NOPERM (ACL)
        log.warning(
            "%s could not check Redis' maxmemory-policy (%s): make sure it is noeviction, or offsets, "
            "cursors and metadata can be evicted",
            service,
            exc,
        )
        return False
    except RedisError as exc:
        raise StorageError(f"cannot reach Redis to check its maxmemory-policy: {exc}") from exc
    values = {_str(k): _str(v) for k, v in dict(reply).items()}
    policy = values.get("maxmemory-policy", "")
    if policy != NOEVICTION:
        raise InvalidArgument(
            f"Redis runs with maxmemory-policy {policy or '?'}, which may evict keys and so silently delete "
            f"committed offsets, cursors and metadata: set `maxmemory-policy {NOEVICTION}` "
            "(redis.conf, or CONFIG SET) and start again"
        )
    return True


async def noeviction_guard(
    client: aioredis.Redis, service: str, on_refused: Callable[[InvalidArgument], None]
) -> asyncio.Task[None] | None:
    """Check the policy now (raising InvalidArgument if it is wrong). If Redis is down, warn, serve
    anyway (retriable errors until it is back, never a crash loop) and check as soon as it answers,
    calling ``on_refused`` then if the policy is wrong; returns that background check's task."""
    try:
        await require_noeviction(client, service)
        return None
    except StorageError as exc:
        log.warning("%s: %s; serving, and checking once Redis answers", service, exc.message)

    async def later() -> None:
        delay = 0.2
        while True:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            try:
                await require_noeviction(client, service)
                return
            except StorageError:
                continue
            except InvalidArgument as exc:
                on_refused(exc)
                return

    return asyncio.create_task(later(), name="redis-maxmemory-policy")


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)
