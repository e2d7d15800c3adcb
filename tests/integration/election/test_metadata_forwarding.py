"""A standby's Metadata is the leader's answer, relayed: against a real ``sluice coordinator`` process as
the leader (no election needed for that) and the standby's forwarder in this process."""

from __future__ import annotations

import asyncio

import pytest

from sluice.coordinator.election import LeaderInfo
from sluice.coordinator.election.forward import FORWARDED_HEADER, MetadataForwarder
from sluice.errors import InvalidTopic, NotCoordinator
from sluice.v1 import coordinator_pb2 as pb
from tests.harness import free_port, run_redis, run_service


class Standby:
    """The Elector view of a standby that follows ``leader`` (only what the forwarder reads)."""

    identity = "standby"

    def __init__(self, leader: LeaderInfo | None) -> None:
        self._leader = leader

    async def run(self, on_elected: object, on_lost: object) -> None:
        raise NotImplementedError

    def is_leader(self) -> bool:
        return False

    def leader(self) -> LeaderInfo | None:
        return self._leader

    async def resign(self) -> None:
        return None

    def fenced(self) -> None:
        return None


def test_a_standby_relays_the_leaders_metadata_and_refuses_when_it_cannot() -> None:
    async def scenario(leader_address: str) -> None:
        forwarder = MetadataForwarder(Standby(LeaderInfo("leader", leader_address, 1)))
        try:
            response = await forwarder.metadata(pb.MetadataRequest(topics=["nope"]))
            assert f"{response.coordinator.host}:{response.coordinator.port}" == leader_address
            assert list(response.unknown_topics) == ["nope"], "the leader's own answer"
            # The leader's typed errors come through as they are.
            with pytest.raises(InvalidTopic):
                await forwarder.metadata(pb.MetadataRequest(topics=["not a topic!"]))
            # No second hop.
            with pytest.raises(NotCoordinator, match="not forwarded again"):
                await forwarder.metadata(pb.MetadataRequest(), [(FORWARDED_HEADER, "other-standby")])
        finally:
            await forwarder.close()

        nobody = MetadataForwarder(Standby(None))
        with pytest.raises(NotCoordinator, match="no leader is elected yet"):
            await nobody.metadata(pb.MetadataRequest())
        await nobody.close()

        gone = MetadataForwarder(Standby(LeaderInfo("dead", f"127.0.0.1:{free_port()}", 1)))
        with pytest.raises(NotCoordinator, match=r"leader is 127\.0\.0\.1:\d+ \(the leader did not answer"):
            await gone.metadata(pb.MetadataRequest())
        await gone.close()

    with (
        run_redis(appendonly=False) as r,
        run_service(
            "coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", r.url, "--advertised-host",
            "127.0.0.1",
        ) as leader,
    ):  # fmt: skip
        asyncio.run(scenario(leader.address))
