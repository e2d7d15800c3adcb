"""Which credentials a client presents, and what it does when a server refuses them (docs/security.md,
"Clients: credentials in the SDK, CLI and Spark").

:func:`token_source` resolves the ``Client``'s (and the CLI's, the Spark source's) arguments and
environment into one token source, with one precedence:

1. ``token=`` (a string or a callable) or ``token_file=``;
2. ``username=`` / ``password=`` (a SCRAM login, :class:`~sluice.security.scram_login.ScramLogin`);
3. ``SLUICE_TOKEN``, then ``SLUICE_TOKEN_FILE``;
4. ``SLUICE_USERNAME`` / ``SLUICE_PASSWORD``.

Giving a token and a user name is ambiguous and refused (``InvalidArgument``); so is a user name
without a password.

:func:`refused` is the one place a refusal reaches a token source: the gRPC token interceptors and
the wire clients call it when a server answers UNAUTHENTICATED (or CREDENTIALS_EXPIRED) to a token, so
a source that can get a new one (a SCRAM login) does, and the next call or connection carries it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sluice.common.client_security import TLSConfig, TokenSource
from sluice.errors import InvalidArgument

__all__ = [
    "PASSWORD_ENV",
    "TOKEN_FILE_ENV",
    "USERNAME_ENV",
    "TokenFile",
    "token_source",
]

USERNAME_ENV = "SLUICE_USERNAME"
PASSWORD_ENV = "SLUICE_PASSWORD"
TOKEN_ENV = "SLUICE_TOKEN"
TOKEN_FILE_ENV = "SLUICE_TOKEN_FILE"

#: How often a token file is looked at (a stat) at most.
TOKEN_FILE_CHECK_S = 1.0


class TokenFile:
    """A token kept in a file that something else rotates (a projected Kubernetes ServiceAccount
    token, which the kubelet rewrites at 80% of its life). The file is read again when its
    modification time or size changes; it is looked at (one ``stat``) at most once a second, so a
    call costs a clock read otherwise. A file that cannot be read keeps the token already read."""

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Callable[[], float] = time.monotonic,
        check_every: float = TOKEN_FILE_CHECK_S,
    ) -> None:
        self.path = Path(path)
        self._clock = clock
        self._check_every = check_every
        self._lock = threading.Lock()
        self._token = ""
        self._stamp: tuple[int, int] | None = None
        self._checked = float("-inf")
        #: Reads of the file (for tests).
        self.reads = 0
        self()  # a missing or empty file is an error at once, not at the first call

    def __call__(self) -> str:
        now = self._clock()
        with self._lock:
            if now - self._checked < self._check_every:
                return self._token
            self._checked = now
            try:
                st = self.path.stat()
                stamp = (st.st_mtime_ns, st.st_size)
                if stamp != self._stamp:
                    token = self.path.read_text(encoding="utf-8").strip()
                    self.reads += 1
                    if token:
                        self._token, self._stamp = token, stamp
            except (OSError, UnicodeDecodeError) as exc:
                if not self._token:
                    raise InvalidArgument(f"token file {self.path}: {exc}") from None
            if not self._token:
                raise InvalidArgument(f"token file {self.path} is empty")
            return self._token

    def refused(self, token: str | None = None) -> None:
        """A server refused the token: look at the file again at the next call."""
        with self._lock:
            self._checked = float("-inf")


def token_source(
    bootstrap: str,
    tls: TLSConfig | None,
    *,
    token: str | Callable[[], str] | None = None,
    token_file: str | Path | None = None,
    username: str | None = None,
    password: str | None = None,
) -> TokenSource | None:
    """The token source the arguments, else the environment, name (precedence in the module doc)."""
    if token is not None and token_file is not None:
        raise InvalidArgument("give token or token_file, not both")
    explicit_token = token is not None or token_file is not None
    if explicit_token and (username is not None or password is not None):
        raise InvalidArgument("give a token or a user name and password, not both")
    if token is not None:
        return _fixed(token) if isinstance(token, str) else token
    if token_file is not None:
        return TokenFile(token_file)
    if username is not None or password is not None:
        return _login(bootstrap, tls, username, password)
    env_token = os.environ.get(TOKEN_ENV) or None
    if env_token is not None:
        return _fixed(env_token)
    env_file = os.environ.get(TOKEN_FILE_ENV) or None
    if env_file is not None:
        return TokenFile(env_file)
    env_user, env_password = os.environ.get(USERNAME_ENV) or None, os.environ.get(PASSWORD_ENV) or None
    if env_user is not None or env_password is not None:
        return _login(bootstrap, tls, env_user, env_password)
    return None


def _fixed(token: str) -> TokenSource:
    if not token.strip():
        raise InvalidArgument("the token is empty")
    return lambda: token


def _login(bootstrap: str, tls: TLSConfig | None, username: str | None, password: str | None) -> TokenSource:
    if not username:
        raise InvalidArgument(f"a password needs a user name (username= or ${USERNAME_ENV})")
    if not password:
        raise InvalidArgument(f"user {username!r} needs a password (password= or ${PASSWORD_ENV})")
    # Imported here: the login needs the peer layer, which imports this package's client module.
    from sluice.security.scram_login import ScramLogin

    return ScramLogin(bootstrap, username, password, tls)
