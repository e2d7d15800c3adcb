"""The ACL decision engine: Kafka's semantics as properties (Hypothesis) and as examples."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.errors import AuthorizationError, InvalidArgument
from sluice.security.acl import (
    ALL,
    WILDCARD,
    AclAuthorizer,
    AclEntry,
    AclFilter,
    AclSet,
    PatternType,
    Permission,
)
from sluice.security.model import (
    ANONYMOUS,
    CLUSTER_RESOURCE,
    Operation,
    Principal,
    Resource,
    ResourceType,
)
from sluice.security.settings import SecuritySettings

NAMED_TYPES = [ResourceType.TOPIC, ResourceType.GROUP, ResourceType.SUBSCRIPTION]
PRINCIPALS = ["alice", "bob", WILDCARD]
names = st.text(alphabet="abc.-", min_size=1, max_size=6)
operations = st.sampled_from(list(Operation))
acl_operations = st.one_of(operations, st.just(ALL))


@st.composite
def entries(draw: st.DrawFn, permission: Permission | None = None) -> AclEntry:
    rtype = draw(st.sampled_from([*NAMED_TYPES, ResourceType.CLUSTER]))
    if rtype is ResourceType.CLUSTER:
        pattern, name = PatternType.LITERAL, WILDCARD
    else:
        pattern = draw(st.sampled_from(list(PatternType)))
        name = draw(names if pattern is PatternType.PREFIXED else st.one_of(names, st.just(WILDCARD)))
    return AclEntry(
        principal=draw(st.sampled_from(PRINCIPALS)),
        resource_type=rtype,
        pattern=pattern,
        name=name,
        operation=draw(acl_operations),
        permission=permission or draw(st.sampled_from(list(Permission))),
    )


@st.composite
def questions(draw: st.DrawFn) -> tuple[Principal, Operation, Resource]:
    rtype = draw(st.sampled_from([*NAMED_TYPES, ResourceType.CLUSTER]))
    resource = CLUSTER_RESOURCE if rtype is ResourceType.CLUSTER else Resource(rtype, draw(names))
    principal = Principal(draw(st.sampled_from(["alice", "bob", "carol"])), "scram")
    return principal, draw(operations), resource


def reference(acls: list[AclEntry], principal: Principal, op: Operation, resource: Resource) -> bool:
    """Kafka's rule written the slow, obvious way: a scan over every entry."""
    name = resource.name or WILDCARD
    applicable = [
        e
        for e in acls
        if e.resource_type is resource.type
        and not principal.anonymous
        and e.principal in (principal.name, WILDCARD)
        and (name.startswith(e.name) if e.pattern is PatternType.PREFIXED else e.name in (name, WILDCARD))
    ]
    if any(e.permission is Permission.DENY and e.operation in (op, ALL) for e in applicable):
        return False
    return any(e.permission is Permission.ALLOW and e.grants(op) for e in applicable)


# ---- properties -------------------------------------------------------------------------------------


@given(st.lists(entries(), max_size=30), questions())
def test_the_index_decides_like_a_scan_of_every_entry(
    acls: list[AclEntry], q: tuple[Principal, Operation, Resource]
) -> None:
    assert AclSet(acls).decide(*q) == reference(acls, *q)


@given(st.lists(entries(), max_size=20), questions())
def test_deny_wins_over_any_allow(acls: list[AclEntry], q: tuple[Principal, Operation, Resource]) -> None:
    principal, op, resource = q
    name = resource.name or WILDCARD
    deny = AclEntry(principal.name, resource.type, PatternType.LITERAL, name, op, Permission.DENY)
    allow_all = AclEntry(WILDCARD, resource.type, PatternType.LITERAL, WILDCARD, ALL, Permission.ALLOW)
    assert not AclSet([*acls, allow_all, deny]).decide(*q)
    assert not AclAuthorizer(AclSet([deny, *acls, allow_all])).allowed(*q)


@given(names, names, operations, st.sampled_from(NAMED_TYPES))
def test_a_prefixed_acl_matches_exactly_the_names_with_that_prefix(
    prefix: str, name: str, op: Operation, rtype: ResourceType
) -> None:
    allow = AclEntry("alice", rtype, PatternType.PREFIXED, prefix, op, Permission.ALLOW)
    asked = (Principal("alice"), op, Resource(rtype, name))
    assert AclSet([allow]).decide(*asked) == name.startswith(prefix)
    # Another resource type with the same name is never matched.
    other = next(t for t in NAMED_TYPES if t is not rtype)
    assert not AclSet([allow]).decide(Principal("alice"), op, Resource(other, name))


@given(st.lists(entries(), min_size=1, max_size=20), st.data(), st.lists(questions(), max_size=10))
def test_removing_an_allow_never_grants_more(
    acls: list[AclEntry], data: st.DataObject, asked: list[tuple[Principal, Operation, Resource]]
) -> None:
    allows = [e for e in acls if e.permission is Permission.ALLOW]
    if not allows:
        return
    removed = data.draw(st.sampled_from(allows))
    before, after = AclSet(acls), AclSet(e for e in acls if e != removed)
    for q in asked:
        assert not after.decide(*q) or before.decide(*q)


@given(st.lists(entries(), max_size=20), st.lists(questions(), min_size=1, max_size=30))
def test_the_cache_answers_like_no_cache(
    acls: list[AclEntry], asked: list[tuple[Principal, Operation, Resource]]
) -> None:
    acl_set = AclSet(acls)
    tiny = AclAuthorizer(acl_set, cache_size=3)  # evicts all the time
    big = AclAuthorizer(acl_set)
    for q in asked + asked:  # each question at least twice: the second answer comes from the cache
        assert tiny.allowed(*q) == big.allowed(*q) == acl_set.decide(*q)
    assert tiny.cached <= 3


# ---- examples -----------------------------------------------------------------------------------------


def topic(name: str) -> Resource:
    return Resource(ResourceType.TOPIC, name)


ALICE = Principal("alice", "scram")


def test_default_deny_when_enabled_and_allow_all_when_not() -> None:
    assert not AclAuthorizer(AclSet()).allowed(ALICE, Operation.READ, topic("t"))
    assert AclAuthorizer(AclSet(), enabled=False).allowed(ANONYMOUS, Operation.DELETE, topic("t"))


def test_super_users_and_the_cluster_pass_everything_even_a_deny() -> None:
    deny = AclEntry.of(WILDCARD, "topic", WILDCARD, "all", "deny")
    auth = AclAuthorizer(AclSet([deny]), super_users=frozenset({"admin"}))
    assert auth.allowed(Principal("admin"), Operation.DELETE, topic("t"))
    assert auth.allowed(
        Principal("broker-1", "cluster", cluster=True), Operation.CLUSTER_ACTION, CLUSTER_RESOURCE
    )
    assert not auth.allowed(ALICE, Operation.READ, topic("t"))


def test_implied_operations_widen_allows_but_not_denies() -> None:
    for op in (Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER):
        acls = AclSet([AclEntry.of("alice", "topic", "t", op)])
        assert acls.decide(ALICE, Operation.DESCRIBE, topic("t")), op
        assert not acls.decide(ALICE, Operation.DESCRIBE_CONFIGS, topic("t")), op
    configs = AclSet([AclEntry.of("alice", "topic", "t", "alter_configs")])
    assert configs.decide(ALICE, Operation.DESCRIBE_CONFIGS, topic("t"))
    assert not configs.decide(ALICE, Operation.DESCRIBE, topic("t"))
    # A deny of read leaves describe alone (allowed by the write allow), and read itself denied.
    mixed = AclSet(
        [AclEntry.of("alice", "topic", "t", "write"), AclEntry.of("alice", "topic", "t", "read", "deny")]
    )
    assert mixed.decide(ALICE, Operation.DESCRIBE, topic("t"))
    assert not mixed.decide(ALICE, Operation.READ, topic("t"))
    # A deny of describe does not deny read.
    describe_denied = AclSet(
        [AclEntry.of("alice", "topic", "t", "read"), AclEntry.of("alice", "topic", "t", "describe", "deny")]
    )
    assert describe_denied.decide(ALICE, Operation.READ, topic("t"))
    assert not describe_denied.decide(ALICE, Operation.DESCRIBE, topic("t"))


def test_anonymous_matches_no_wildcard_entry() -> None:
    acls = AclSet([AclEntry.of(WILDCARD, "topic", WILDCARD, "all")])
    assert acls.decide(ALICE, Operation.READ, topic("t"))
    assert not acls.decide(ANONYMOUS, Operation.READ, topic("t"))


def test_literal_wildcard_name_and_cluster_entries() -> None:
    acls = AclSet(
        [
            AclEntry.of("alice", "group", WILDCARD, "read"),
            AclEntry.of("alice", "cluster", WILDCARD, "create"),
        ]
    )
    assert acls.decide(ALICE, Operation.READ, Resource(ResourceType.GROUP, "anything"))
    assert not acls.decide(ALICE, Operation.READ, topic("anything"))
    assert acls.decide(ALICE, Operation.CREATE, CLUSTER_RESOURCE)
    # A topic literally named '*' is matched only by '*' entries, never treated as a pattern.
    assert not AclSet([AclEntry.of("alice", "topic", "x", "read")]).decide(ALICE, Operation.READ, topic("*"))


def test_authorize_names_the_operation_and_resource_as_asked() -> None:
    auth = AclAuthorizer(AclSet([AclEntry.of("alice", "topic", "mine", "read")]))
    auth.authorize(ALICE, Operation.READ, topic("mine"))
    with pytest.raises(AuthorizationError) as err:
        auth.authorize(ALICE, Operation.READ, topic("no-such-topic"))
    assert err.value.message == "'alice' is not authorized to read topic:no-such-topic"
    with pytest.raises(
        AuthorizationError, match="anonymous caller is not authorized to cluster_action cluster"
    ):
        auth.authorize(ANONYMOUS, Operation.CLUSTER_ACTION, CLUSTER_RESOURCE)


def test_replace_drops_the_cache_and_tells_the_listeners() -> None:
    auth = AclAuthorizer(AclSet([AclEntry.of("alice", "topic", "t", "read")], version=1))
    assert auth.allowed(ALICE, Operation.READ, topic("t"))
    assert auth.cached == 1
    seen: list[int] = []
    unsubscribe = auth.on_change(lambda s: seen.append(s.version))

    def broken(_: AclSet) -> None:
        raise RuntimeError("a buggy listener")

    auth.on_change(broken)
    auth.replace(AclSet(version=2))
    assert auth.cached == 0
    assert not auth.allowed(ALICE, Operation.READ, topic("t"))
    assert seen == [2]
    assert auth.version == 2
    unsubscribe()
    auth.replace(AclSet(version=3))
    assert seen == [2]


def test_the_cache_is_bounded_oldest_first() -> None:
    auth = AclAuthorizer(AclSet([AclEntry.of("alice", "topic", "t", "read")]), cache_size=2)
    for name in ("a", "b", "c", "t"):
        auth.allowed(ALICE, Operation.READ, topic(name))
    assert auth.cached == 2


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"principal": ""}, "principal must not be empty"),
        ({"name": ""}, "resource name must not be empty"),
        ({"resource_type": "queue"}, "unknown resource type 'queue'"),
        ({"operation": "fly"}, "unknown operation"),
        ({"permission": "maybe"}, "unknown permission"),
        ({"pattern": "regex"}, "unknown pattern type"),
        ({"pattern": "prefixed", "name": "*"}, "prefixed ACL cannot be"),
        ({"resource_type": "cluster", "name": "c1"}, "cluster ACL names the cluster"),
        ({"principal": "a\nb"}, "printable"),
    ],
)
def test_bad_entries_are_refused_with_typed_errors(fields: dict[str, str], message: str) -> None:
    base = {
        "principal": "alice",
        "resource_type": "topic",
        "name": "t",
        "operation": "read",
        "permission": "allow",
        "pattern": "literal",
    }
    with pytest.raises(InvalidArgument, match=message):
        AclEntry.of(**{**base, **fields})


def test_filters_select_entries_and_round_trip() -> None:
    a = AclEntry.of("alice", "topic", "t", "read")
    b = AclEntry.of("bob", "topic", "t", "write", "deny")
    c = AclEntry.of("bob", "group", "g", "read", pattern="prefixed")
    acls = AclSet([c, b, a, a])
    assert len(acls) == 3
    assert acls.select(AclFilter(principal="bob")) == [c, b]  # sorted: principal, type, pattern, name...
    assert acls.select(AclFilter(resource_type=ResourceType.TOPIC, permission=Permission.DENY)) == [b]
    assert acls.select(AclFilter(pattern=PatternType.PREFIXED, operation=Operation.READ)) == [c]
    assert acls.select(AclFilter()) == list(acls)
    assert AclEntry.from_dict(c.to_dict()) == c
    with pytest.raises(InvalidArgument, match="lacks"):
        AclEntry.from_dict({"principal": "x"})


def test_from_settings() -> None:
    auth = AclAuthorizer.from_settings(SecuritySettings(authorization="acl", super_users=" admin, ops ,"))
    assert auth.enabled
    assert auth.super_users == {"admin", "ops"}
    assert not AclAuthorizer.from_settings(SecuritySettings()).enabled
    with pytest.raises(InvalidArgument, match="--authorization 'acls'"):
        AclAuthorizer.from_settings(SecuritySettings(authorization="acls"))
