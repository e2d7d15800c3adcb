"""What the coordinator process uses: settings and their validation, the guard's messages."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

import pytest

from sluice.coordinator.election import (
    CoordinatorElection,
    ElectionSettings,
    LeaderInfo,
    default_identity,
    leader_guard,
    leader_hint,
    validate_election,
)
from sluice.errors import InvalidArgument, NotCoordinator
from tests.unit.election.electors import unreachable_redis


@dataclass
class Config:
    """The election fields of CoordinatorConfig (ElectionConfig), with their defaults."""

    key_prefix: str = "sluice"
    election: str = "redis"
    lease_name: str = ""
    lease_namespace: str = ""
    identity: str = ""
    lease_duration: timedelta = timedelta(seconds=15)
    renew_deadline: timedelta = timedelta(seconds=10)
    retry_period: timedelta = timedelta(seconds=2)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (Config(election="zookeeper"), "--election 'zookeeper': expected one of redis, kubernetes, none"),
        (Config(renew_deadline=timedelta(seconds=15)), "--renew-deadline"),
        (Config(retry_period=timedelta(0)), "--retry-period"),
        (Config(election="kubernetes"), "--lease-name"),
        (Config(election="kubernetes", lease_name="l"), "--lease-namespace"),
    ],
)
def test_contradictory_settings_are_refused_naming_the_flag(
    config: Config, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    with pytest.raises(InvalidArgument, match=message):
        validate_election(config)


def test_none_skips_the_timing_checks() -> None:
    validate_election(Config(election="none", renew_deadline=timedelta(seconds=99)))


def test_kubernetes_defaults_come_from_the_downward_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "team-a")
    monkeypatch.setenv("POD_NAME", "sluice-coordinator-7d9f-abcde")
    settings = ElectionSettings.from_config(Config(election="kubernetes", lease_name="sluice-coordinator"))
    assert settings.lease_namespace == "team-a"
    assert settings.identity == "sluice-coordinator-7d9f-abcde"
    assert settings.timing.lease_duration == 15.0


def test_identity_outside_kubernetes_is_host_and_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAME", raising=False)
    host, _, pid = default_identity().rpartition(":")
    assert host
    assert pid.isdigit()
    assert ElectionSettings.from_config(Config(identity="mine")).identity == "mine"


class StaticElector:
    """An Elector whose view is set by the test (the guard only reads it)."""

    def __init__(self, identity: str, leader: LeaderInfo | None, leading: bool = False) -> None:
        self.identity = identity
        self._leader = leader
        self._leading = leading

    async def run(self, on_elected: object, on_lost: object) -> None:
        raise NotImplementedError

    def is_leader(self) -> bool:
        return self._leading

    def leader(self) -> LeaderInfo | None:
        return self._leader

    async def resign(self) -> None:
        return None

    def fenced(self) -> None:
        return None


def test_the_guard_names_the_leader_in_a_form_the_sdk_can_parse() -> None:
    leader_guard(None)  # --election none: always the writer
    leader_guard(StaticElector("me", LeaderInfo("me", "10.0.0.1:7600", 3), leading=True))
    with pytest.raises(NotCoordinator) as caught:
        leader_guard(StaticElector("me", LeaderInfo("them", "10.0.0.2:7600", 3)))
    assert caught.value.message == "not the leader; leader is 10.0.0.2:7600"
    assert caught.value.retriable
    assert leader_hint(caught.value.message) == "10.0.0.2:7600"
    with pytest.raises(NotCoordinator, match="no leader is elected yet") as none_yet:
        leader_guard(StaticElector("me", None))
    assert leader_hint(none_yet.value.message) is None
    with pytest.raises(NotCoordinator, match="this replica, still taking office"):
        leader_guard(StaticElector("me", LeaderInfo("me", "10.0.0.1:7600", 3)))


def test_before_the_election_starts_every_request_is_refused() -> None:
    async def check() -> None:
        async with unreachable_redis() as redis:
            election = CoordinatorElection.from_config(Config(), redis)
            assert election is not None
            assert not election.is_leader()
            assert election.leader() is None
            with pytest.raises(NotCoordinator, match="starting"):
                election.guard()
            await election.close()
            assert CoordinatorElection.from_config(Config(election="none"), redis) is None

    asyncio.run(check())
