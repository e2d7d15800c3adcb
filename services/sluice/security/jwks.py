"""The JWKS (JSON Web Key Set) behind JWT verification: fetched from a URL, cached, refetched at a
limited rate (docs/security.md, "JWT and Kubernetes ServiceAccount tokens").

Two pieces:

- :class:`JwksFetcher`: one blocking HTTPS GET (``urllib``) with a timeout, a size limit, an optional
  CA bundle and bearer token (the Kubernetes API server's ``/openid/v1/jwks`` wants both), no
  redirects (a redirect would carry the bearer token to wherever it points).
- :class:`JwksCache`: the keys by ``kid``. A token naming a ``kid`` the cache does not hold (a rotated
  key) triggers a refetch, but at most one fetch runs at a time (concurrent callers share it) and at most
  one starts per ``refetch_interval``: a flood of tokens with made-up kids costs dictionary lookups, not
  fetches. The fetch runs in a thread, so the event loop is never blocked on the network.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from sluice.errors import InvalidArgument
from sluice.security.jwt_keys import Jwk, parse_jwks

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_TIMEOUT", "JwksCache", "JwksFetcher"]

log = logging.getLogger(__name__)

#: A JWKS holds a handful of keys (a few KiB); a larger answer is a misconfigured URL or an attack.
DEFAULT_MAX_BYTES = 1 << 20
DEFAULT_TIMEOUT = 5.0


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        # Returning None makes urllib raise the 3xx as an HTTPError instead of following it.
        return None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class JwksFetcher:
    """GETs the JWKS document: ``fetch()`` is blocking, call it in a thread (JwksCache does).

    Plain ``http://`` is refused except to a loopback address (a test, a sidecar): anyone on the path
    of a plaintext fetch could hand the verifier their own keys.
    """

    def __init__(
        self,
        url: str,
        *,
        ca_file: Path | None = None,
        token_file: Path | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise InvalidArgument(f"jwt_jwks_url: {url!r} is not an https:// URL")
        if parts.scheme == "http" and not _is_loopback(parts.hostname):
            raise InvalidArgument(f"jwt_jwks_url: {url!r}: plain http is allowed only to a loopback address")
        self.url = url
        self._ca_file = ca_file
        self._token_file = token_file
        self._timeout = timeout
        self._max_bytes = max_bytes
        self._ssl_context()  # a missing or malformed CA bundle fails at start, not at the first token
        if token_file is not None:
            self._bearer_token()

    def _ssl_context(self) -> ssl.SSLContext:
        # Built per fetch (fetches are rare): a rotated CA bundle is picked up without a restart.
        try:
            return ssl.create_default_context(cafile=str(self._ca_file) if self._ca_file else None)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidArgument(f"jwt_jwks_ca_file: cannot load {self._ca_file}: {exc}") from exc

    def _bearer_token(self) -> str:
        # Re-read per fetch: the kubelet rotates a projected ServiceAccount token in place.
        assert self._token_file is not None
        try:
            return self._token_file.read_text().strip()
        except OSError as exc:
            raise InvalidArgument(
                f"jwt_jwks_token_file: cannot read {self._token_file}: {exc.strerror}"
            ) from exc

    def fetch(self) -> bytes:
        """The JWKS document's bytes. Raises OSError (URLError, a timeout) or ValueError (too large)."""
        request = urllib.request.Request(self.url, headers={"Accept": "application/json"})
        if self._token_file is not None:
            request.add_header("Authorization", f"Bearer {self._bearer_token()}")
        opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=self._ssl_context()), _NoRedirect()
        )
        with opener.open(request, timeout=self._timeout) as response:
            body: bytes = response.read(self._max_bytes + 1)
        if len(body) > self._max_bytes:
            raise ValueError(f"JWKS larger than {self._max_bytes} bytes")
        return body


class JwksCache:
    """The keys of one JWKS, by kid, refetched at a limited rate.

    ``fetch`` is blocking (a :class:`JwksFetcher`'s, or a test's) and runs in a thread. ``revision``
    grows whenever a fetch drops a key that was there before, so a holder of results verified with the
    old keys (the verifier's token cache) knows to forget them. ``clock`` is monotonic seconds.
    """

    def __init__(
        self,
        fetch: Callable[[], bytes],
        *,
        refetch_interval: float,
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._refetch_interval = refetch_interval
        self._max_age = max_age
        self._clock = clock
        self._keys: dict[str | None, Jwk] | None = None
        self._fetched_at = 0.0
        self._last_attempt: float | None = None
        self._inflight: asyncio.Task[None] | None = None
        self.revision = 0
        self.fetches = 0
        self.last_error = ""

    async def find(self, kid: str | None) -> list[Jwk]:
        """The key named ``kid`` (one or none), or for a token without a kid every key of the set.

        An unknown kid (or no keys yet) refetches if the rate limit allows, sharing a fetch under
        way; a known kid in a set older than ``max_age`` starts a background refetch and answers from
        the current keys. A failed fetch keeps the last good keys.
        """
        now = self._clock()
        if self._keys is None or (kid is not None and kid not in self._keys):
            await self._refresh(now)
        elif now - self._fetched_at > self._max_age:
            self._start_fetch(now)
        keys = self._keys or {}
        if kid is None:
            return list(keys.values())
        found = keys.get(kid)
        return [] if found is None else [found]

    async def _refresh(self, now: float) -> None:
        task = self._start_fetch(now)
        if task is not None:
            # shield: a caller that gives up (its RPC cancelled) does not cancel the fetch others await.
            await asyncio.shield(task)

    def _start_fetch(self, now: float) -> asyncio.Task[None] | None:
        """The fetch under way, else a new one if the rate limit allows, else None."""
        loop = asyncio.get_running_loop()
        if self._inflight is not None and self._inflight.get_loop() is loop:
            return self._inflight
        # (A task of another, finished event loop is forgotten: it can never complete here.)
        if self._last_attempt is not None and now - self._last_attempt < self._refetch_interval:
            return None
        self._last_attempt = now
        task = loop.create_task(self._fetch_and_store())
        self._inflight = task
        task.add_done_callback(self._fetch_done)
        return task

    def _fetch_done(self, task: asyncio.Task[None]) -> None:
        if self._inflight is task:
            self._inflight = None

    async def _fetch_and_store(self) -> None:
        self.fetches += 1
        try:
            keys = parse_jwks(await asyncio.to_thread(self._fetch))
        except Exception as exc:  # OSError, ValueError, a JSON RecursionError alike:
            # whatever the URL answers, verification sees only "no such key", never a crash.
            self.last_error = str(exc)[:200]
            log.warning("JWKS fetch failed (keeping the %d keys held): %s", len(self._keys or {}), exc)
            return
        if self._keys is not None and set(self._keys) - set(keys):
            self.revision += 1
        if self._keys is None or set(self._keys) != set(keys):
            log.info("JWKS: %d keys (kids: %s)", len(keys), ", ".join(sorted(str(kid) for kid in keys)))
        self._keys = keys
        self._fetched_at = self._clock()
        self.last_error = ""
