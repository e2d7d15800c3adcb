"""max_groups and max_members_per_group at the join (docs/limits.md): a typed LIMIT_EXCEEDED in the
heartbeat response, and a rejoin under a known member id is not one more member."""

from __future__ import annotations

import dataclasses

import pytest

from sluice.coordinator.groups.model import HeartbeatRequest
from sluice.errors import InvalidArgument
from sluice.v1 import common_pb2

from .groups_context import SETTINGS, GroupsContext


def _ctx(max_groups: int, max_members: int) -> GroupsContext:
    settings = dataclasses.replace(SETTINGS, max_groups=max_groups, max_members_per_group=max_members)
    c = GroupsContext(settings)
    c.create_topic("t", 2)
    return c


def test_a_join_creating_a_group_over_max_groups_is_refused() -> None:
    ctx = _ctx(max_groups=2, max_members=0)
    assert ctx.heartbeat(group="a").error is None
    assert ctx.heartbeat(group="b").error is None
    refused = ctx.heartbeat(group="c")
    assert refused.error is not None
    assert refused.error.code == common_pb2.LIMIT_EXCEEDED
    assert "max_groups=2" in refused.error.message
    assert "c" not in ctx.groups.groups
    assert ctx.heartbeat(group="a").error is None  # another member of an existing group: fine


def test_a_join_over_max_members_is_refused_but_a_rejoin_is_not_one_more() -> None:
    ctx = _ctx(max_groups=0, max_members=2)
    first = ctx.heartbeat(group="g")
    assert ctx.heartbeat(group="g").error is None
    refused = ctx.heartbeat(group="g")
    assert refused.error is not None
    assert refused.error.code == common_pb2.LIMIT_EXCEEDED
    assert "max_members_per_group=2" in refused.error.message
    assert len(ctx.groups.groups["g"].members) == 2
    rejoin = ctx.heartbeat(group="g", member_id=first.member_id, epoch=0)
    assert rejoin.error is None, rejoin.error


def test_an_oversize_client_or_instance_id_is_refused_naming_the_limit() -> None:
    ctx = _ctx(max_groups=0, max_members=0)
    huge = "c" * 100_000
    base = HeartbeatRequest(group="g", member_id="", member_epoch=0, subscription={"t": "*"})
    for request in (dataclasses.replace(base, client_id=huge), dataclasses.replace(base, instance_id=huge)):
        with pytest.raises(InvalidArgument, match="of 100000 characters exceeds the limit of 255") as info:
            ctx.groups.heartbeat(request, ctx.now_ms, "m1")
        assert len(str(info.value)) < 1024
