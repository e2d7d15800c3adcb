"""The user store: SCRAM credentials and per-user generations in Redis (docs/redis-schema.md, "Users").

One hash, ``{P}:users``, holds everything, so each change is one atomic script on one key (and one Redis
Cluster slot):

- ``cred:<name>``: the stored SCRAM credential (JSON: mechanism, salt, iterations, stored key, server key;
  never the password);
- ``gen:<name>``: the user's generation, bumped by every password change and by a delete, and kept after
  the delete (a tombstone), so a user deleted and created again never gets back a generation an old
  session token carries;
- ``version``: bumped by every change, so a snapshot of :meth:`UserStore.generations` can be versioned.

The store is not part of the coordinator's fenced state machine: a change is one user command applied by
one script, whichever replica serves it (standbys too), with nothing to replay.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from sluice.errors import StorageError
from sluice.security.scram import MECHANISM, ScramCredential, validate_user_name

__all__ = ["LoginRecord", "UserInfo", "UserStore", "UsersSnapshot"]

log = logging.getLogger(__name__)

_UPSERT = """
local existed = redis.call('HEXISTS', KEYS[1], 'cred:' .. ARGV[1])
redis.call('HSET', KEYS[1], 'cred:' .. ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[1], 'version', 1)
return {redis.call('HINCRBY', KEYS[1], 'gen:' .. ARGV[1], 1), existed}
"""
_DELETE = """
if redis.call('HDEL', KEYS[1], 'cred:' .. ARGV[1]) == 0 then return -1 end
redis.call('HINCRBY', KEYS[1], 'version', 1)
return redis.call('HINCRBY', KEYS[1], 'gen:' .. ARGV[1], 1)
"""


@dataclass(frozen=True, slots=True)
class UserInfo:
    name: str
    mechanism: str
    iterations: int
    generation: int


@dataclass(frozen=True, slots=True)
class LoginRecord:
    credential: ScramCredential
    generation: int


@dataclass(frozen=True, slots=True)
class UsersSnapshot:
    #: Bumped by every change of any user.
    version: int
    #: Live users only: a deleted user is absent, so its sessions are refused.
    generations: dict[str, int]


def _encode(c: ScramCredential) -> str:
    b64 = base64.b64encode
    return json.dumps(
        {
            "m": c.mechanism,
            "s": b64(c.salt).decode(),
            "i": c.iterations,
            "sk": b64(c.stored_key).decode(),
            "vk": b64(c.server_key).decode(),
        },
        separators=(",", ":"),
    )


def _decode(raw: bytes | str) -> ScramCredential:
    d = json.loads(raw)
    b64 = base64.b64decode
    return ScramCredential(b64(d["s"]), int(d["i"]), b64(d["sk"]), b64(d["vk"]), d.get("m", MECHANISM))


@contextlib.contextmanager
def _storage(what: str) -> Iterator[None]:
    try:
        yield
    except RedisError as exc:
        raise StorageError(f"users: cannot {what} in Redis: {exc}") from exc


class UserStore:
    def __init__(self, redis: Redis, key_prefix: str) -> None:
        self._redis = redis
        self.key = f"{key_prefix}:users"
        self._upsert: Any = redis.register_script(_UPSERT)
        self._delete: Any = redis.register_script(_DELETE)
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every change this process makes (the security snapshot's push)."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # a listener's bug must not fail the user's command after it landed
                log.exception("user-change listener failed")

    async def upsert(self, name: str, credential: ScramCredential) -> tuple[int, bool]:
        """Create the user or replace its credential: (its new generation, whether it was created)."""
        validate_user_name(name)
        credential.validate()
        with _storage("store the user"):
            generation, existed = await self._upsert(keys=[self.key], args=[name, _encode(credential)])
        log.info("user %s %s (generation %d)", name, "updated" if existed else "created", generation)
        self._changed()
        return int(generation), not existed

    async def delete(self, name: str) -> int | None:
        """Delete the user: its tombstone generation, or None if there was no such user."""
        validate_user_name(name)
        with _storage("delete the user"):
            generation = int(await self._delete(keys=[self.key], args=[name]))
        if generation < 0:
            return None
        log.info("user %s deleted (generation %d)", name, generation)
        self._changed()
        return generation

    async def login_record(self, name: str) -> LoginRecord | None:
        """The credential and generation a login checks, read together (one command)."""
        with _storage("read the user"):
            raw, generation = await self._redis.hmget(self.key, [f"cred:{name}", f"gen:{name}"])
        if raw is None:
            return None
        return LoginRecord(_decode(raw), int(generation or 0))

    async def _all(self) -> tuple[int, dict[str, ScramCredential], dict[str, int]]:
        with _storage("read the users"):
            raw: dict[Any, Any] = await self._redis.hgetall(self.key)
        creds: dict[str, ScramCredential] = {}
        gens: dict[str, int] = {}
        version = 0
        for field, value in raw.items():
            kind, _, name = (field.decode() if isinstance(field, bytes) else field).partition(":")
            if kind == "cred":
                creds[name] = _decode(value)
            elif kind == "gen":
                gens[name] = int(value)
            elif kind == "version":
                version = int(value)
        return version, creds, gens

    async def list_users(self) -> list[UserInfo]:
        _, creds, gens = await self._all()
        return [
            UserInfo(name, c.mechanism, c.iterations, gens.get(name, 0)) for name, c in sorted(creds.items())
        ]

    async def snapshot(self) -> UsersSnapshot:
        version, creds, gens = await self._all()
        return UsersSnapshot(version, {name: gens.get(name, 0) for name in creds})

    async def version(self) -> int:
        """Bumped by every change of any user, by any replica: one HGET, cheap to poll (a change made
        through another coordinator replica fires no :meth:`on_change` here)."""
        with _storage("read the users' version"):
            raw = await self._redis.hget(self.key, "version")
        return int(raw or 0)

    async def all_generations(self) -> dict[str, int]:
        """Every user name this store has seen -> its generation, deleted users' included (their
        generation is one past their last sessions'): the security snapshot's ``user_generations``,
        so a service refuses a deleted user's sessions even before it learns the user is gone."""
        _, _, gens = await self._all()
        return gens

    async def generations(self) -> dict[str, int]:
        """Live user -> generation: a session token is good while its generation is its user's here."""
        return (await self.snapshot()).generations
