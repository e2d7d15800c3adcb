"""Redis down or slow, seen from the offset store's RPCs (docs/offset-store.md, "When Redis is down or slow").

- A commit sent to a frozen Redis (SIGSTOP) gets no answer within the socket timeout: it is answered
  ``COMMIT_OUTCOME_UNKNOWN`` (retriable), never as stored. It *was* applied once Redis ran again, which is
  why it cannot be reported as refused either; retrying it is harmless (commits are idempotent).
- Redis stopped: commits and lookups are answered ``STORAGE_ERROR`` (nothing was sent), quickly; Redis
  back: served again by the same process.
- ``BUSY`` (a script past its time limit): ``STORAGE_ERROR``, a definite refusal.
- The start-up check of ``maxmemory-policy``: refused with one line and exit 1 for an evicting policy
  (offset store and coordinator), a warning when ``CONFIG`` is renamed away or denied by an ACL.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest
import redis

from sluice.client.rpc import call
from sluice.errors import CommitOutcomeUnknown, StorageError
from sluice.v1 import common_pb2
from sluice.v1.offset_store_pb2 import CommitOffsetsRequest, FetchOffsetsRequest
from tests.harness import _env as harness_env
from tests.harness import run_redis, start_service

from .conftest import Stack, start_stack, stop_stack

GROUP = "outage"


def commit(stack: Stack, offset: int, timeout: float = 20) -> int:
    request = CommitOffsetsRequest(group=GROUP, member_id="m1", member_epoch=1)
    request.offsets.add(topic="t", partition=0, offset=offset)
    (result,) = call(stack.stub.CommitOffsets, request, timeout=timeout).results
    assert result.error.code == common_pb2.NONE, result.error
    return result.offset


def stored(stack: Stack) -> int:
    raw = stack.redis.hget(f"sluice:off:{{{GROUP}}}:default", "t/0")
    return -1 if raw is None else int(raw)


def test_a_commit_whose_answer_is_lost_is_in_doubt_and_its_retry_is_harmless() -> None:
    with run_redis() as server:
        stack = start_stack(server)
        try:
            stack.seed_group(GROUP, {"m1": 1}, {"t/0": "m1"})
            assert commit(stack, 10) == 10
            # Redis frozen (SIGSTOP) with the commit in its socket: no answer within the offset store's
            # socket timeout (3 s), so the store cannot know whether it will run.
            server.process.send_signal(signal.SIGSTOP)
            try:
                started = time.monotonic()
                with pytest.raises(CommitOutcomeUnknown, match="may or may not have been applied"):
                    commit(stack, 20)
                assert time.monotonic() - started < 10
            finally:
                server.process.send_signal(signal.SIGCONT)
            # Thawed, Redis reads the command before it notices the closed connection: it *was* applied,
            # which is why the answer could not be "refused" either.
            deadline = time.monotonic() + 30
            while stored(stack) != 20:
                assert time.monotonic() < deadline, stored(stack)
                time.sleep(0.1)
            # The retry (the SDK's, on a retriable error) is harmless: increase-only, same answer.
            assert commit(stack, 20) == 20
            assert commit(stack, 20) == 20
            assert commit(stack, 15) == 20  # an older retry arriving late does not move it back
            assert stored(stack) == 20
            assert stack.service.process.poll() is None
            assert "Traceback" not in stack.service.log()
        finally:
            stop_stack(stack)


def test_redis_stopped_gives_storage_errors_then_service_resumes_with_few_log_lines() -> None:
    with run_redis() as server:
        stack = start_stack(server)
        try:
            stack.seed_group(GROUP, {"m1": 1}, {"t/0": "m1"})
            assert commit(stack, 5) == 5
            server.kill()
            # The first write may go out on the pooled connection Redis closed as it died: in doubt (the
            # store cannot tell "closed before" from "closed after"). Every later one finds the port
            # closed: never sent, a plain STORAGE_ERROR.
            with pytest.raises((CommitOutcomeUnknown, StorageError)):
                commit(stack, 6, timeout=10)
            failures = 0
            started = time.monotonic()
            for _ in range(30):
                with pytest.raises(StorageError):  # refused connection: never sent, so not in doubt
                    commit(stack, 6, timeout=10)
                with pytest.raises(StorageError):
                    call(stack.stub.FetchOffsets, FetchOffsetsRequest(group=GROUP), timeout=10)
                failures += 2
            assert time.monotonic() - started < 30  # fast answers, no hang
            server.restart()
            deadline = time.monotonic() + 30
            while True:
                try:
                    assert commit(stack, 7, timeout=5) == 7
                    break
                except StorageError:
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
            # The service writes "answers again" as it answers the commit: its log file may get the
            # line a moment after our call returns (a loaded CI run read it too early).
            give_up = time.monotonic() + 10
            while "Redis answers again" not in (log := stack.service.log()) and time.monotonic() < give_up:
                time.sleep(0.1)
            assert stack.service.process.poll() is None
            assert "Traceback" not in log
            # One warning at the start, at most one per 10 s, one when Redis is back: not one per failure.
            warnings = log.count(" WARNING ")
            assert warnings <= 6, log[-3000:]
            assert "Redis answers again" in log
        finally:
            stop_stack(stack)


def test_busy_redis_is_a_definite_storage_error() -> None:
    with run_redis(extra=("--busy-reply-threshold", "100")) as server:
        stack = start_stack(server)
        try:
            stack.seed_group(GROUP, {"m1": 1}, {"t/0": "m1"})
            assert commit(stack, 3) == 3
            spin = "local t = redis.call('TIME')[1] + 4 while tonumber(redis.call('TIME')[1]) < t do end"

            def busy() -> None:
                with redis.Redis(port=server.port) as r, pytest.raises(redis.RedisError):
                    r.eval(spin, 0)  # ended by SCRIPT KILL below

            thread = threading.Thread(target=busy, daemon=True)
            thread.start()
            time.sleep(0.5)  # the script past its 100 ms threshold: Redis answers BUSY to everyone
            with pytest.raises(StorageError, match="BUSY"):
                commit(stack, 4, timeout=10)
            with redis.Redis(port=server.port) as r:
                r.script_kill()
            thread.join(10)
            assert commit(stack, 4) == 4
        finally:
            stop_stack(stack)


@pytest.mark.parametrize("service", ["offset-store", "coordinator"])
def test_an_evicting_redis_is_refused_at_start_up(service: str) -> None:
    with run_redis(extra=("--maxmemory-policy", "allkeys-lru")) as server:
        url = ("--redis-url", server.url)
        done = subprocess.run(
            [sys.executable, "-m", "sluice", service, *("--port", "0", "--metrics-port", "0"), *url],
            capture_output=True,
            text=True,
            timeout=60,
            env=harness_env(),
            check=False,
        )
    assert done.returncode == 1, done
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, done.stderr
    assert "maxmemory-policy allkeys-lru" in errors[0]
    assert "noeviction" in errors[0]
    assert "Traceback" not in done.stderr + done.stdout


def test_a_forbidden_config_command_is_warned_about_and_start_up_goes_on() -> None:
    acl = ("--user", "sluice", "on", ">secret", "~*", "+@all", "-config")
    with run_redis(extra=acl) as server:
        url = f"redis://sluice:secret@127.0.0.1:{server.port}/0"
        sp = start_service("offset-store", "--port", "0", "--metrics-port", "0", "--redis-url", url)
        try:
            assert "could not check Redis' maxmemory-policy" in sp.log()
        finally:
            assert sp.terminate() == 0


def test_redis_down_at_start_up_is_served_through_then_an_evicting_policy_stops_the_store() -> None:
    with run_redis() as server:
        server.kill()
        sp = start_service("offset-store", "--port", "0", "--metrics-port", "0", "--redis-url", server.url)
        try:
            assert "checking once Redis answers" in sp.log()
            server.extra = ("--maxmemory-policy", "allkeys-lru")
            server.restart()
            assert sp.process.wait(30) == 1
            deadline = time.monotonic() + 10  # the output pump may still be reading the last lines
            while "refuses to run: Redis runs with maxmemory-policy allkeys-lru" not in sp.log():
                assert time.monotonic() < deadline, sp.log()
                time.sleep(0.05)
            assert "Traceback" not in sp.log()
        finally:
            sp.terminate()


def test_a_coordinator_started_while_redis_is_down_waits_for_it() -> None:
    with run_redis() as server:
        server.kill()
        cmd = [sys.executable, "-m", "sluice", "coordinator", "--port", "0", "--metrics-port", "0"]
        proc = subprocess.Popen(
            [*cmd, "--redis-url", server.url],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=harness_env(),
        )
        try:
            assert proc.stdout is not None
            lines: list[str] = []
            for line in proc.stdout:  # the first warning says it waits; it has not exited
                lines.append(line)
                if "waiting for it" in line:
                    break
            assert proc.poll() is None, lines
            server.restart()
            for line in proc.stdout:
                lines.append(line)
                if "SLUICE_READY" in line:
                    break
            assert any("SLUICE_READY" in line for line in lines), lines
            assert not any("Traceback" in line for line in lines), lines
        finally:
            proc.terminate()
            proc.communicate(timeout=30)
