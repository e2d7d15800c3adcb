"""Restarts: kill -9 Redis (AOF, appendfsync always) and bring it back.

Every commit and cursor the offset store acknowledged is still there, and the
same offset-store process serves again without being restarted: it reconnects
to Redis and reloads its Lua scripts (the script cache does not survive).
"""

from __future__ import annotations

import hashlib
import time

import pytest

from sluice.client.rpc import call
from sluice.errors import StorageError
from sluice.offsetstore import scripts
from sluice.v1 import common_pb2
from sluice.v1.offset_store_pb2 import (
    CommitOffsetsRequest,
    Cursor,
    FetchOffsetsRequest,
    LoadCursorRequest,
    SaveCursorsRequest,
)
from tests.harness import run_redis

from .conftest import start_stack, stop_stack

PARTITIONS = 8


def test_acknowledged_commits_survive_a_redis_kill_and_the_service_reconnects() -> None:
    with run_redis(appendonly=True) as redis_server:
        stack = start_stack(redis_server)
        try:
            owners = {f"t/{p}": "m1" for p in range(PARTITIONS)}
            stack.seed_group("g", {"m1": 1}, owners)
            acknowledged: dict[int, int] = {}
            for round_ in range(1, 26):
                request = CommitOffsetsRequest(group="g", member_id="m1", member_epoch=1)
                for p in range(PARTITIONS):
                    request.offsets.add(topic="t", partition=p, offset=round_ * 10 + p)
                for result in call(stack.stub.CommitOffsets, request, timeout=10).results:
                    assert result.error.code == common_pb2.NONE
                    acknowledged[result.partition] = result.offset
            cursor = Cursor(subscription="s", topic="t", partition=0, mark_delete=3, owner_epoch=4)
            cursor.acked_ranges.extend([5, 9, 11, 12])
            cursor.redelivery_counts[3] = 2
            saved = call(stack.stub.SaveCursors, SaveCursorsRequest(cursors=[cursor]), timeout=10)
            assert saved.errors[0].code == common_pb2.NONE

            redis_server.kill()
            # While Redis is down: a retriable storage error, not a crash or a hang.
            started = time.monotonic()
            with pytest.raises(StorageError, match="storage unavailable"):
                call(stack.stub.FetchOffsets, FetchOffsetsRequest(group="g"), timeout=20)
            assert time.monotonic() - started < 10
            assert stack.service.process.poll() is None

            redis_server.restart()
            # The same process, no restart: it reconnects and reloads its scripts.
            fetched = call(stack.stub.FetchOffsets, FetchOffsetsRequest(group="g"), timeout=10)
            assert {o.partition: o.offset for o in fetched.offsets} == acknowledged
            loaded = call(
                stack.stub.LoadCursor, LoadCursorRequest(subscription="s", topic="t", partition=0), timeout=10
            )
            assert loaded.found
            assert (loaded.cursor.mark_delete, loaded.cursor.owner_epoch) == (3, 4)
            assert list(loaded.cursor.acked_ranges) == [5, 9, 11, 12]
            assert dict(loaded.cursor.redelivery_counts) == {3: 2}
            # Writes work again through both scripts, which are reloaded after Redis forgot them.
            shas = [hashlib.sha1(s.encode()).hexdigest() for s in (scripts.COMMIT, scripts.SAVE_CURSORS)]
            assert stack.redis.script_exists(*shas) == [False, False]
            request = CommitOffsetsRequest(group="g", member_id="m1", member_epoch=1)
            request.offsets.add(topic="t", partition=0, offset=10_000)
            [result] = call(stack.stub.CommitOffsets, request, timeout=10).results
            assert (result.error.code, result.offset) == (common_pb2.NONE, 10_000)
            cursor.mark_delete = 12
            del cursor.acked_ranges[:]
            saved = call(stack.stub.SaveCursors, SaveCursorsRequest(cursors=[cursor]), timeout=10)
            assert saved.errors[0].code == common_pb2.NONE
            assert stack.redis.script_exists(*shas) == [True, True]
            # A zombie is still fenced after the restart (the ownership keys survived too).
            request.member_epoch = 0
            [result] = call(stack.stub.CommitOffsets, request, timeout=10).results
            assert result.error.code == common_pb2.STALE_MEMBER_EPOCH
        finally:
            stop_stack(stack)
