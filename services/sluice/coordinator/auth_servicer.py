"""``sluice.v1.Auth`` over gRPC: SCRAM-SHA-256 logins that return session tokens, and user management.

Hosted by every coordinator replica (a standby too: logins read Redis, nothing goes through the fenced
write path). docs/security.md, "Passwords (SCRAM) and session tokens", has the reasons; in short:

- the failed-login limiter (``security/rate_limit.py``) is asked first, so a throttled attempt costs a
  dictionary lookup, not a Redis read and a SCRAM exchange;
- an unknown user runs the same exchange against a fake credential derived from the user name (same salt
  every time, same iterations, keys nobody knows), and ends with the same ``UNAUTHENTICATED`` message as a
  wrong password: no user enumeration;
- the session token is keyed from the cluster token, so every service verifies it. Without a cluster
  token the coordinator uses a random key and says so in its log: only it can verify its sessions.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from grpc import aio
from redis.asyncio import Redis

from sluice.common.timeouts import within
from sluice.coordinator.config import CoordinatorConfig
from sluice.coordinator.users import LoginRecord, UserStore
from sluice.errors import AuthenticationError, InvalidArgument, RequestTimedOut
from sluice.security.audit import audit_current
from sluice.security.rate_limit import FailureLimiter, client_host
from sluice.security.scram import (
    DEFAULT_ITERATIONS,
    MECHANISM,
    SALT_BYTES,
    ScramCredential,
    validate_user_name,
)
from sluice.security.session_tokens import SessionTokens, derive_key, read_cluster_token
from sluice.server.runtime import Registrar
from sluice.v1 import auth_pb2 as pb
from sluice.v1 import auth_pb2_grpc

__all__ = ["FAILED", "SERVICE_NAME", "AuthService", "AuthServicer"]

log = logging.getLogger(__name__)
Context = aio.ServicerContext[Any, Any]

SERVICE_NAME = "sluice.v1.Auth"
#: The one answer to a wrong password and to an unknown user.
FAILED = "authentication failed: unknown user or wrong password"
#: A SCRAM message is a few hundred bytes; anything longer is not one.
MAX_SCRAM_BYTES = 4096
#: How long the server waits for each client message of an exchange.
STEP_TIMEOUT_S = 10.0
_FAKE_PURPOSE = b"sluice scram fake credentials v1"


def _escaped_name(client_first: str) -> str | None:
    """The user name of a client-first message (``n,,n=alice,r=nonce``), or None if it has none.
    Parsed here because the credential must be read (async) before scramp asks for it (sync)."""
    parts = client_first.split(",")
    if len(parts) < 4 or not parts[2].startswith("n="):
        return None
    return parts[2][2:].replace("=2C", ",").replace("=3D", "=")


class _Exchange:
    """One login's SCRAM server. Hides from scramp whether the user exists."""

    def __init__(self, name: str, credential: ScramCredential) -> None:
        # scramp (and the asn1crypto it imports, ~2.5 MB of RSS) loads at the first login, not in
        # every coordinator (docs/latency.md, "Memory").
        from scramp import ScramMechanism

        self.name = name
        self._credential = credential
        self.server = ScramMechanism(MECHANISM).make_server(self._auth)

    def _auth(self, username: str) -> tuple[bytes, bytes, bytes, int]:
        from scramp import ScramException
        from scramp.utils import ServerError

        c = self._credential
        if username != self.name:  # SASLprep changed it: not the name whose credential was read
            raise ScramException("user name mismatch", ServerError.OTHER_ERROR)
        return c.salt, c.stored_key, c.server_key, c.iterations


@dataclass
class AuthService:
    """The coordinator's authentication parts; the integrator's authentication chain takes ``tokens``
    (verification) and ``users`` (generations for the security snapshot) from here."""

    users: UserStore
    tokens: SessionTokens
    limiter: FailureLimiter
    ttl_s: float
    #: Keys the fake credentials of unknown users.
    fake_key: bytes

    @classmethod
    def from_config(cls, config: CoordinatorConfig, redis: Redis) -> AuthService:
        if config.cluster_token_file is not None:
            secret = read_cluster_token(config.cluster_token_file)
            tokens = SessionTokens.from_cluster_token(secret)
            fake_key = derive_key(secret, _FAKE_PURPOSE)
        else:
            log.warning(
                "no --cluster-token-file: session tokens are keyed with a random key of this process; "
                "other services (and other coordinator replicas) cannot verify them, and a restart "
                "ends every session"
            )
            tokens, fake_key = SessionTokens.random(), secrets.token_bytes(32)
        return cls(
            UserStore(redis, config.key_prefix),
            tokens,
            FailureLimiter(config.login_limits()),
            config.session_token_ttl.total_seconds(),
            fake_key,
        )

    def registrar(self) -> Registrar:
        def register(server: aio.Server) -> None:
            auth_pb2_grpc.add_AuthServicer_to_server(AuthServicer(self), server)

        return register

    def fake_credential(self, name: str) -> ScramCredential:
        """The same credential for a name every time (as a real user's salt is), that nobody can log in
        with."""

        def part(label: bytes) -> bytes:
            return hmac.new(self.fake_key, label + name.encode(), hashlib.sha256).digest()

        return ScramCredential(
            part(b"salt:")[:SALT_BYTES], DEFAULT_ITERATIONS, part(b"stored:"), part(b"server:")
        )


async def _next(messages: AsyncIterator[pb.AuthMessage], what: str) -> pb.AuthMessage:
    try:
        return await within(anext(messages), STEP_TIMEOUT_S)
    except StopAsyncIteration:
        raise InvalidArgument(f"the client ended the login before its {what}") from None
    except TimeoutError:
        raise RequestTimedOut(f"no {what} within {STEP_TIMEOUT_S:g} s") from None


def _text(message: pb.AuthMessage, what: str) -> str:
    if len(message.scram) > MAX_SCRAM_BYTES:
        raise InvalidArgument(f"the {what} is longer than {MAX_SCRAM_BYTES} bytes")
    try:
        return message.scram.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"the {what} is not UTF-8") from None


class AuthServicer(auth_pb2_grpc.AuthServicer):
    def __init__(self, auth: AuthService) -> None:
        self._auth = auth

    async def Authenticate(
        self, request_iterator: AsyncIterator[pb.AuthMessage], context: Context
    ) -> AsyncIterator[pb.AuthMessage]:
        auth = self._auth
        address = client_host(context.peer() or "")
        messages = aiter(request_iterator)
        first = await _next(messages, "client-first message")
        if first.mechanism != MECHANISM:
            raise InvalidArgument(f"unsupported mechanism {first.mechanism[:40]!r}: use {MECHANISM}")
        client_first = _text(first, "client-first message")
        name = _escaped_name(client_first)
        # Before any work: a throttled attempt costs nothing more. Counted as failed until it succeeds.
        auth.limiter.begin(address, name)
        record = await self._record(name)
        from scramp import ScramException
        from scramp.utils import ServerError

        exchange = _Exchange(
            name or "", record.credential if record is not None else auth.fake_credential(name or "")
        )
        try:
            exchange.server.set_client_first(client_first)
            yield pb.AuthMessage(scram=exchange.server.get_server_first().encode())
            final = _text(await _next(messages, "client-final message"), "client-final message")
            exchange.server.set_client_final(final)
            server_final = exchange.server.get_server_final()
        except ScramException as exc:
            if exc.server_error == ServerError.INVALID_PROOF:
                log.info("failed login for %r from %s", name, address)
                raise AuthenticationError(FAILED) from None
            raise InvalidArgument(f"malformed SCRAM message: {exc}") from None
        if record is None or name is None:  # unreachable: nobody knows the fake keys
            raise AuthenticationError(FAILED)
        auth.limiter.succeeded(address, name)
        token = auth.tokens.mint(name, "scram", record.generation, auth.ttl_s)
        claims = auth.tokens.verify(token)
        assert claims is not None
        yield pb.AuthMessage(
            scram=server_final.encode(),
            session_token=token,
            expires_at_ms=int(claims.expires_at * 1000),
            lifetime_ms=int(auth.ttl_s * 1000),
        )

    async def _record(self, name: str | None) -> LoginRecord | None:
        try:
            valid = validate_user_name(name) if name is not None else None
        except InvalidArgument:
            valid = None  # an impossible name: the same answer as an unknown one, after the same work
        if valid is None:
            await self._auth.users.login_record("")  # the same Redis round trip as a real lookup
            return None
        return await self._auth.users.login_record(valid)

    async def UpsertUser(self, request: pb.UpsertUserRequest, context: Context) -> pb.UpsertUserResponse:
        validate_user_name(request.name)
        if not request.HasField("credential"):
            raise InvalidArgument("credential is required (computed from the password on the client)")
        c = request.credential
        credential = ScramCredential(c.salt, c.iterations, c.stored_key, c.server_key, c.mechanism)
        generation, created = await self._auth.users.upsert(request.name, credential)
        audit_current("user.add" if created else "user.password", {"user": request.name})
        return pb.UpsertUserResponse(generation=generation, created=created)

    async def DeleteUser(self, request: pb.DeleteUserRequest, context: Context) -> pb.DeleteUserResponse:
        generation = await self._auth.users.delete(validate_user_name(request.name))
        if generation is not None:
            audit_current("user.delete", {"user": request.name})
        return pb.DeleteUserResponse(deleted=generation is not None, generation=generation or 0)

    async def ListUsers(self, request: pb.ListUsersRequest, context: Context) -> pb.ListUsersResponse:
        return pb.ListUsersResponse(
            users=[
                pb.UserDescription(
                    name=u.name, mechanism=u.mechanism, iterations=u.iterations, generation=u.generation
                )
                for u in await self._auth.users.list_users()
            ]
        )
