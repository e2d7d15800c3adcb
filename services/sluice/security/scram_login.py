"""``ScramLogin``: the SDK's token source for a user name and password (docs/security.md, "Passwords
(SCRAM) and session tokens").

A :data:`~sluice.common.client_security.TokenSource`: each call returns the session token to send now. It logs
in (SCRAM-SHA-256 with the coordinator's ``Auth.Authenticate``) on the first call, caches the session
token, refreshes it in a background thread once 80% of its lifetime has passed (the calls meanwhile get
the still-valid one, so a caller never waits for a refresh), and logs in again after :meth:`refused`
(the server answered UNAUTHENTICATED: a restart with another key, a password change). Only the first
login and one after a refusal or an expiry block the caller: one exchange, two round trips plus PBKDF2 on
this side (~5 ms at 16384 iterations).

From an event loop (the group driver, a service), await :meth:`ScramLogin.fresh` instead of calling: it
does a blocking login in a worker thread, so the loop never waits on the network. A plain call costs a
lock and a clock read while the token is fresh, and is fine anywhere.

The password stays in this object's memory only; it never travels (SCRAM sends a proof) and is never
written anywhere.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
from scramp import ScramClient, ScramException

from sluice.common.backoff import Backoff
from sluice.common.client_security import ClientSecurity, TLSConfig
from sluice.common.peers import Peers
from sluice.common.rpc import error_from_rpc
from sluice.errors import (
    AuthenticationError,
    BrokerNotAvailable,
    InvalidArgument,
    RequestTimedOut,
    SluiceError,
)
from sluice.security.scram import MECHANISM, validate_user_name
from sluice.v1 import auth_pb2 as pb
from sluice.v1 import auth_pb2_grpc

__all__ = ["REFRESH_AT", "ScramLogin", "Session", "login_channels", "scram_login"]

log = logging.getLogger(__name__)

#: The share of a session's lifetime after which it is refreshed.
REFRESH_AT = 0.8


def login_channels(tls: TLSConfig | None) -> Peers:
    """The channels a login uses: the TLS settings and no token (a login is how one gets a token)."""
    return Peers(max_peers=4, security=ClientSecurity(tls=tls))


@dataclass(frozen=True, slots=True)
class Session:
    token: str
    lifetime_s: float


def scram_login(stub: auth_pb2_grpc.AuthStub, username: str, password: str, timeout: float) -> Session:
    """One SCRAM-SHA-256 exchange: the session the coordinator issues. Also checks the server's
    signature, so a server that does not hold the user's credential cannot pose as the coordinator."""
    try:
        client = ScramClient([MECHANISM], username, password)
    except ScramException as exc:
        raise InvalidArgument(f"unusable user name or password: {exc}") from None
    inbox: queue.Queue[str | None] = queue.Queue()

    def requests() -> Iterator[pb.AuthMessage]:  # runs on gRPC's request thread
        yield pb.AuthMessage(mechanism=MECHANISM, scram=client.get_client_first().encode())
        server_first = inbox.get(timeout=timeout)
        if server_first is None:
            return
        client.set_server_first(server_first)
        yield pb.AuthMessage(scram=client.get_client_final().encode())

    try:
        responses = iter(stub.Authenticate(requests(), timeout=timeout))
        inbox.put(next(responses).scram.decode())
        final = next(responses)
        client.set_server_final(final.scram.decode())
    except grpc.RpcError as exc:
        raise error_from_rpc(exc) from None
    except (ScramException, UnicodeDecodeError, StopIteration) as exc:
        raise AuthenticationError(f"the coordinator's SCRAM answer is not valid: {exc}") from None
    finally:
        inbox.put(None)  # the request thread stops waiting if the exchange ended early
    if not final.session_token or final.lifetime_ms <= 0:
        raise AuthenticationError("the coordinator issued no session token")
    return Session(final.session_token, final.lifetime_ms / 1000)


class ScramLogin:
    """A thread-safe token source that logs in with SCRAM and keeps a session token fresh."""

    def __init__(
        self,
        bootstrap: str,
        username: str,
        password: str,
        tls: TLSConfig | None = None,
        *,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.username = validate_user_name(username)
        if not isinstance(password, str) or not password:
            raise InvalidArgument("the password must not be empty")
        self._bootstrap = bootstrap
        self._password = password
        self._timeout = timeout
        self._clock = clock
        self._channels = login_channels(tls)
        self._lock = threading.Lock()  # guards the fields below; never held across a login
        self._login_lock = threading.Lock()  # one login at a time
        self._token: str | None = None
        self._refresh_at = 0.0
        self._expires_at = 0.0
        self._refreshing = False
        #: Logins done (for tests and metrics).
        self.logins = 0

    def __call__(self) -> str:
        now = self._clock()
        with self._lock:
            token = self._token
            if token is not None and now < self._expires_at:
                if now >= self._refresh_at and not self._refreshing:
                    self._refreshing = True
                    threading.Thread(target=self._refresh, name="sluice-scram-refresh", daemon=True).start()
                return token
        return self._login_if_needed()

    def valid_token(self) -> str | None:
        """The cached token if it has not expired, without logging in (never blocks on the network)."""
        with self._lock:
            return self._token if self._token is not None and self._clock() < self._expires_at else None

    async def fresh(self) -> str:
        """The token to send, for a caller on an event loop: a login runs in a worker thread."""
        token = self.valid_token()
        if token is not None:
            return self()  # may start a background refresh; does not block
        return await asyncio.to_thread(self)

    def refused(self, token: str | None = None) -> None:
        """The server refused ``token`` (UNAUTHENTICATED): the next call logs in again. A refusal of an
        older token than the cached one changes nothing."""
        with self._lock:
            if token is None or token == self._token:
                self._token = None

    def close(self) -> None:
        self._channels.close()

    def _login_if_needed(self) -> str:
        with self._login_lock:
            token = self.valid_token()  # another thread may have logged in while this one waited
            return token if token is not None else self._login()

    def _refresh(self) -> None:
        try:
            with self._login_lock:
                self._login()
        except SluiceError as exc:
            # The current token stays until it expires; try again after a short wait, not on every call.
            log.warning("refreshing the session of %s failed: %s", self.username, exc)
            with self._lock:
                self._refresh_at = self._clock() + min(5.0, max(0.0, self._expires_at - self._clock()) / 4)
        finally:
            with self._lock:
                self._refreshing = False

    def _login(self) -> str:
        """Log in (caller holds the login lock), retrying an unreachable coordinator up to the timeout."""
        deadline = self._clock() + self._timeout
        backoff = Backoff()
        while True:
            started = self._clock()
            try:
                stub = self._channels.stub(self._bootstrap, auth_pb2_grpc.AuthStub)
                session = scram_login(stub, self.username, self._password, self._timeout)
                break
            except BrokerNotAvailable as exc:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise RequestTimedOut(f"login: coordinator unreachable: {exc.message}") from exc
                time.sleep(min(backoff.next(), remaining))
        with self._lock:
            self._token = session.token
            self._refresh_at = started + REFRESH_AT * session.lifetime_s
            self._expires_at = started + session.lifetime_s
            self.logins += 1
        return session.token
