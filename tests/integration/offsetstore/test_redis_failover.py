"""A Sentinel failover under commits: the offset store follows the new primary, and what it acknowledged with
``--commit-replicas 1`` (Redis WAIT) survives it, counted.

Real processes: a Redis primary, a replica and a Sentinel (tests/harness.py, ``run_redis_sentinel``), the
offset store given the Sentinel's address (``redis+sentinel://``), and ``kill -9`` of the primary.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest
import redis

from sluice.client.rpc import call
from sluice.errors import NotEnoughReplicas, SluiceError
from sluice.offsetstore.keys import DEFAULT_TRACK, Keys, partition_field
from sluice.v1 import common_pb2, offset_store_pb2_grpc
from sluice.v1.offset_store_pb2 import CommitOffsetsRequest, FetchOffsetsRequest
from tests.harness import SentinelSet, ServiceProcess, run_redis_sentinel, start_service

from .conftest import TOPICS, topic_id_of

PARTITIONS = 4
ROUNDS_BEFORE_KILL = 15
DEADLINE_S = 40


def _seed(primary_port: int) -> None:
    """The keys the coordinator would write: topics exist, group g's member m1 owns every partition."""
    with redis.Redis(port=primary_port) as r:
        for topic in TOPICS:
            r.set(f"sluice:topic:{{{topic}}}:id", topic_id_of(topic))
        r.hset("sluice:grp:{g}:members", mapping={"m1": 1})
        r.hset("sluice:grp:{g}:owners", mapping={f"t/{p}": "m1" for p in range(PARTITIONS)})
        r.set("sluice:grp:{g}:live", 1)
        assert r.execute_command("WAIT", 1, 5000) == 1  # the replica has the seed before anything fails


@contextmanager
def _offset_store(sentinels: SentinelSet, replicas: int) -> Iterator[offset_store_pb2_grpc.OffsetStoreStub]:
    service: ServiceProcess = start_service(
        "offset-store",
        *("--port", "0", "--metrics-port", "0", "--redis-url", sentinels.url),
        *("--commit-replicas", str(replicas), "--commit-replicas-timeout-ms", "500"),
    )
    channel = grpc.insecure_channel(service.address)
    try:
        yield offset_store_pb2_grpc.OffsetStoreStub(channel)
    finally:
        channel.close()
        assert service.terminate() == 0, service.log()


def _commit(stub: offset_store_pb2_grpc.OffsetStoreStub, offset: int) -> dict[int, int]:
    request = CommitOffsetsRequest(group="g", member_id="m1", member_epoch=1)
    for p in range(PARTITIONS):
        request.offsets.add(topic="t", partition=p, offset=offset + p)
    results = call(stub.CommitOffsets, request, timeout=10).results
    assert all(r.error.code == common_pb2.NONE for r in results)
    return {r.partition: r.offset for r in results}


def _stored(stub: offset_store_pb2_grpc.OffsetStoreStub) -> dict[int, int]:
    fetched = call(stub.FetchOffsets, FetchOffsetsRequest(group="g"), timeout=10)
    return {o.partition: o.offset for o in fetched.offsets}


def _wait_for_failover(sentinels: SentinelSet) -> float:
    started = time.monotonic()
    while sentinels.primary_port() != sentinels.replica.port:
        assert time.monotonic() - started < 20, "the Sentinel did not promote the replica"
        time.sleep(0.05)
    return time.monotonic() - started


def test_commits_acknowledged_with_wait_survive_killing_the_primary() -> None:
    with run_redis_sentinel() as sentinels, _offset_store(sentinels, replicas=1) as stub:
        _seed(sentinels.primary.port)
        acknowledged: dict[int, int] = {}
        refused: dict[str, int] = {}
        killed = restarted = False
        offset = 0
        started = time.monotonic()
        while time.monotonic() - started < DEADLINE_S:
            offset += 10
            try:
                acknowledged.update(_commit(stub, offset))
            except SluiceError as err:
                refused[err.code_name] = refused.get(err.code_name, 0) + 1
                time.sleep(0.05)
            if not killed and offset == ROUNDS_BEFORE_KILL * 10:
                sentinels.primary.kill()
                killed = True
                failover_s = _wait_for_failover(sentinels)
            elif killed and not restarted and refused.get("NOT_ENOUGH_REPLICAS"):
                # The new primary has no replica, so WAIT 1 refuses to acknowledge: bring the old primary
                # back; the Sentinel turns it into the new primary's replica.
                sentinels.primary.restart()
                restarted = True
            if restarted and len(acknowledged) == PARTITIONS and offset >= 60 * 10 and not _refusing(stub):
                break
        stored = _stored(stub)
        print(
            f"acknowledged up to {max(acknowledged.values())}, refused {refused}, "
            f"failover {failover_s:.2f} s, stored {stored}"
        )
        assert killed
        assert restarted
        # Nothing acknowledged was lost: every partition holds at least its last acknowledged offset.
        lost = {p: (o, stored.get(p, -1)) for p, o in acknowledged.items() if stored.get(p, -1) < o}
        assert lost == {}
        # And the guard was really in play: without a replica the commits were refused, not acknowledged.
        assert refused.get("NOT_ENOUGH_REPLICAS", 0) >= 1
        # The store followed the failover to the new primary and writes there again.
        assert max(acknowledged.values()) > ROUNDS_BEFORE_KILL * 10 + PARTITIONS
        with redis.Redis(port=sentinels.primary_port()) as r:
            key = Keys("sluice").offsets("g", DEFAULT_TRACK)
            assert int(r.hget(key, partition_field("t", 0)) or -1) >= acknowledged[0]


def _refusing(stub: offset_store_pb2_grpc.OffsetStoreStub) -> bool:
    try:
        _stored(stub)
    except SluiceError:
        return True
    return False


def test_without_wait_a_failover_can_lose_an_acknowledged_commit_and_with_it_the_commit_is_refused() -> None:
    """The replica is paused and its link cut, so it cannot have the write. With WAIT the commit is refused
    (never acknowledged); without it, it is acknowledged and then lost when the replica is promoted."""
    with run_redis_sentinel() as sentinels:
        _seed(sentinels.primary.port)
        with _offset_store(sentinels, replicas=0) as plain, _offset_store(sentinels, replicas=1) as guarded:
            _commit(guarded, 100)  # held by the replica too
            os.kill(sentinels.replica.process.pid, signal.SIGSTOP)
            try:
                # Pausing alone is not enough: what the primary already sent waits in the paused replica's
                # socket and is read when it resumes. Closing the link stops the primary sending anything.
                with redis.Redis(port=sentinels.primary.port) as r:
                    r.client_kill_filter(_type="replica")
                with pytest.raises(NotEnoughReplicas, match="held by 0 of the 1 replicas"):
                    _commit(guarded, 200)
                assert _commit(plain, 300)[0] == 300  # acknowledged by the primary alone
                sentinels.primary.kill()
            finally:
                os.kill(sentinels.replica.process.pid, signal.SIGCONT)
            _wait_for_failover(sentinels)
            deadline = time.monotonic() + 20
            while True:
                try:
                    stored = _stored(plain)
                    break
                except SluiceError:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            # The plain store's acknowledged 300 is gone: the new primary never had it.
            assert stored[0] == 100
