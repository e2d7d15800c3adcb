"""Property: whatever members do (join, leave, heartbeat releasing any subset, stall, crash), no partition
is ever owned by two members - neither in the coordinator's state nor in what the clients hold - and the
ownership keys in "Redis" always equal the state."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.coordinator.groups.model import ConflictPolicy, GroupConfig, HeartbeatResponse

from .groups_context import GroupsContext, durable


@dataclass
class Client:
    """A well-behaved SDK consumer: takes what it is assigned, releases revoked partitions only in a later
    heartbeat (after "committing"), and rejoins after being fenced."""

    member_id: str = ""
    epoch: int = 0
    held: set[tuple[str, str, int]] = field(default_factory=set)  # (track, topic, partition)
    revoked: set[tuple[str, str, int]] = field(default_factory=set)

    def owned(self) -> set[tuple[str, int]]:
        return {(t, p) for _, t, p in self.held}

    def absorb(self, r: HeartbeatResponse) -> None:
        if r.error is not None:
            # Fenced or unknown: drop everything without committing, rejoin next time.
            self.member_id, self.epoch, self.held, self.revoked = "", 0, set(), set()
            return
        self.member_id, self.epoch = r.member_id, r.member_epoch
        if r.member_epoch < 0:
            self.member_id, self.epoch, self.held, self.revoked = "", 0, set(), set()
            return
        if r.assignment is not None:
            assigned = {(a.track, a.topic, a.partition) for a in r.assignment}
            self.revoked = self.held - assigned
            self.held = (self.held & assigned) | assigned


FILTERS = ["*", "tagA", "tagB"]

# Each step: (kind, member or milliseconds, partitions a heartbeat releases).
step: st.SearchStrategy[tuple[str, int, AbstractSet[int]]] = st.one_of(
    st.tuples(st.just("heartbeat"), st.integers(0, 4), st.sets(st.integers(0, 7), max_size=8)),
    st.tuples(st.just("leave"), st.integers(0, 4), st.just(frozenset())),
    st.tuples(st.just("advance"), st.integers(100, 4_000), st.just(frozenset())),
    st.tuples(st.just("crash"), st.integers(0, 4), st.just(frozenset())),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(step, min_size=5, max_size=60),
    filters=st.lists(st.sampled_from(FILTERS), min_size=5, max_size=5),
    policy=st.sampled_from([ConflictPolicy.REJECT, ConflictPolicy.SPLIT]),
)
def test_no_partition_is_ever_owned_twice(
    steps: list[tuple[str, int, AbstractSet[int]]], filters: list[str], policy: ConflictPolicy
) -> None:
    ctx = GroupsContext()
    ctx.create_topic("t", 6)
    ctx.apply(ctx.groups.set_config("g", GroupConfig(policy), True, ctx.now_ms))
    clients = [Client() for _ in range(5)]
    crashed: set[int] = set()
    for kind, n, release in steps:
        if kind == "advance":
            ctx.advance(n)
        elif kind == "crash":
            # The process dies: it holds nothing any more and never heartbeats under this id again.
            clients[n] = Client()
            crashed.add(n)
        elif kind == "leave":
            c = clients[n]
            if c.member_id:
                c.absorb(ctx.heartbeat(member_id=c.member_id, epoch=-1, subscription={"t": filters[n]}))
        else:
            c = clients[n]
            # Release (after committing) the revoked partitions picked by ``release``.
            for slot in sorted(c.revoked):
                if slot[2] in release:
                    c.held.discard(slot)
                    c.revoked.discard(slot)
            c.absorb(
                ctx.heartbeat(
                    member_id=c.member_id, epoch=c.epoch, subscription={"t": filters[n]}, owned=c.owned()
                )
            )
        # Clients the coordinator removed (session or rebalance timeout) are zombies: the offset store
        # refuses their commits. Only members the coordinator knows count for exclusivity.
        g = ctx.groups.groups.get("g")
        members = set(g.members) if g else set()
        holders: dict[tuple[str, str, int], str] = {}
        for c in clients:
            if c.member_id not in members:
                continue
            for slot in c.held:
                assert slot not in holders, f"{slot} held by {holders[slot]} and {c.member_id}"
                holders[slot] = c.member_id
                assert g is not None
                assert g.owner.get(slot) == c.member_id
        if g is not None:
            for mid, cur in g.current.items():
                assert cur.assigned.isdisjoint(cur.pending), mid
        ctx.check_redis_matches_state()
    assert durable(ctx.recover()) == durable(ctx.groups)
