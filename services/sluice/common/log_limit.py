"""A warning that an outage logs a few times, not once per failed request (issue 16: no log line or
traceback per request while a store is down)."""

from __future__ import annotations

import logging
import time

__all__ = ["RateLimitedWarning"]


class RateLimitedWarning:
    """One warning when a store (``subject``) starts failing, then at most one per ``interval`` with the
    count of the failures in between, and one line when it answers again: an outage costs a few log
    lines, not one (or a traceback) per request. Callers: one event loop (no lock)."""

    def __init__(self, logger: logging.Logger, subject: str = "Redis", interval: float = 10.0) -> None:
        self._log = logger
        self._subject = subject
        self._interval = interval
        self._down_since = 0.0
        self._last = 0.0
        self._suppressed = 0
        self._failures = 0

    def failed(self, what: str, exc: BaseException) -> None:
        now = time.monotonic()
        self._failures += 1
        if not self._down_since:
            self._down_since = now
        if self._last and now - self._last < self._interval:
            self._suppressed += 1
            return
        more = f" ({self._suppressed} more failures since the last warning)" if self._suppressed else ""
        self._log.warning("%s unavailable while %s: %s%s", self._subject, what, exc, more)
        self._last, self._suppressed = now, 0

    def succeeded(self) -> None:
        if self._down_since:
            self._log.warning(
                "%s answers again after %.1f s (%d requests failed meanwhile)",
                self._subject,
                time.monotonic() - self._down_since,
                self._failures,
            )
            self._down_since = self._last = 0.0
            self._suppressed = self._failures = 0
