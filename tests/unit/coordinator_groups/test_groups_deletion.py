"""DeleteGroup's decision (groups/deletion.py), on the pure state machine: refused while members are there
(a static member that is away too), and a delete leaves no record of the group, even after recovery."""

from __future__ import annotations

import pytest

from sluice.coordinator.groups.deletion import GroupKeysFound, delete_group, deletion_ops
from sluice.coordinator.groups.model import ConflictPolicy, GroupConfig
from sluice.errors import GroupNotEmpty, UnknownGroup
from sluice.offsetstore.keys import Keys

from .groups_context import GroupsContext, apply_ops

KEYS_OF_G = GroupKeysFound(("sluice:grp:{g}:live", "sluice:off:{g}:default"), offsets=4)


@pytest.fixture
def ctx() -> GroupsContext:
    c = GroupsContext()
    c.create_topic("t", 4)
    return c


def test_a_group_with_members_is_not_deleted(ctx: GroupsContext) -> None:
    joined = ctx.heartbeat(instance_id="static-1")
    with pytest.raises(GroupNotEmpty, match="1 active member"):
        delete_group(ctx.groups, "g", KEYS_OF_G)
    ctx.apply(ctx.groups.leave("g", joined.member_id, -2, ctx.now_ms))  # a static member steps away
    with pytest.raises(GroupNotEmpty):
        delete_group(ctx.groups, "g", KEYS_OF_G)


def test_an_empty_group_is_deleted_with_every_record(ctx: GroupsContext) -> None:
    ctx.apply(ctx.groups.set_config("g", GroupConfig(conflict_policy=ConflictPolicy.SPLIT), True, ctx.now_ms))
    joined = ctx.heartbeat()
    ctx.apply(ctx.groups.leave("g", joined.member_id, -1, ctx.now_ms))
    assert any("g" in field for field in ctx.store if not field.startswith(("topic:", "broker:", "cluster:")))
    ctx.redis["sluice:off:{g}:default"] = {"t/0": "3"}

    # What the SCAN finds (tested against a real Redis in tests/integration/cli/test_cli_admin.py).
    ctx.redis["sluice:topic:{t}:refs"] = {"sluice:off:{g}:default": "h", "sluice:cur:{s}:t/0": "k"}
    found = GroupKeysFound(
        tuple(sorted(k for k in ctx.redis if "{g}" in k)), offsets=1, topics=frozenset({"t"})
    )
    assert "sluice:grp:{g}:members" in found.keys
    deleted = ctx.apply(delete_group(ctx.groups, "g", found))
    apply_ops(ctx.redis, deletion_ops(found, Keys("sluice")))
    # Unregistered from the topic's refs (topic identity): only other owners' keys stay named there.
    assert ctx.redis["sluice:topic:{t}:refs"] == {"sluice:cur:{s}:t/0": "k"}
    assert deleted == 1
    assert "g" not in ctx.groups.groups
    assert [f for f in ctx.store if f.endswith(":g") or ":g/" in f] == []
    assert "g" not in ctx.recover().groups
    assert not [k for k in ctx.redis if "{g}" in k]
    with pytest.raises(UnknownGroup, match="does not exist"):
        delete_group(ctx.groups, "g", GroupKeysFound((), 0))


def test_offsets_alone_make_a_group_that_can_be_deleted(ctx: GroupsContext) -> None:
    """A group only ever reset (no coordinator records) still has keys to delete."""
    result = delete_group(
        ctx.groups, "only-offsets", GroupKeysFound(("sluice:off:{only-offsets}:default",), 2)
    )
    assert result.response == 2
    assert result.records == ()
