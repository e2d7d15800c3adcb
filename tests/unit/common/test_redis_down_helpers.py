"""What proves a Redis command never ran (so a write failing that way is not in doubt), and the warning an
outage logs a few times instead of once per request (docs/offset-store.md, "When Redis is down or slow")."""

from __future__ import annotations

import asyncio
import logging

import pytest
from redis.exceptions import BusyLoadingError, ReadOnlyError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sluice.common.log_limit import RateLimitedWarning
from sluice.common.redis_client import never_sent, redis_errors
from sluice.errors import CommitOutcomeUnknown, StorageError


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ResponseError("BUSY Redis is busy running a script"), True),
        (BusyLoadingError("Redis is loading the dataset in memory"), True),
        (ReadOnlyError("You can't write against a read only replica."), True),
        (RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."), True),
        (RedisTimeoutError("Timeout connecting to server"), True),
        (RedisConnectionError("Connection closed by server."), False),
        (RedisTimeoutError("Timeout reading from socket"), False),
    ],
)
def test_only_an_error_reply_or_a_failed_connect_proves_a_command_never_ran(
    exc: Exception, expected: bool
) -> None:
    assert never_sent(exc) is expected  # type: ignore[arg-type]


def test_a_write_in_doubt_is_commit_outcome_unknown_and_a_read_a_storage_error() -> None:
    warn = RateLimitedWarning(logging.getLogger("test"))

    async def fail(write: bool, exc: Exception) -> None:
        async with redis_errors("committing", warn, write=write):
            raise exc

    lost = RedisTimeoutError("Timeout reading from socket")
    with pytest.raises(CommitOutcomeUnknown, match="may or may not have been applied"):
        asyncio.run(fail(True, lost))
    with pytest.raises(StorageError):
        asyncio.run(fail(False, lost))
    with pytest.raises(StorageError):
        asyncio.run(fail(True, ResponseError("LOADING")))
    assert CommitOutcomeUnknown.retriable
    assert CommitOutcomeUnknown.grpc_status == "UNAVAILABLE"


def test_an_outage_logs_a_first_warning_one_per_interval_and_one_when_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    warn = RateLimitedWarning(logging.getLogger("test.limit"), interval=3600)
    with caplog.at_level(logging.WARNING, "test.limit"):
        for _ in range(1000):
            warn.failed("committing", OSError("down"))
        warn.succeeded()
        warn.succeeded()  # nothing more: it was logged once
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "Redis unavailable while committing" in lines[0]
    assert "answers again" in lines[1]
    assert "1000 requests failed" in lines[1]
