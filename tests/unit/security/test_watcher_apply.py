"""``SecurityWatcher.apply``: what a snapshot does to the service's copy (no network here; the long poll
itself is tested against a real coordinator in tests/integration/security)."""

from __future__ import annotations

from sluice.security.acl import AclAuthorizer, AclEntry, AclSet
from sluice.security.acl_proto import entry_to_proto
from sluice.security.model import Operation, Principal, Resource, ResourceType
from sluice.security.watcher import SecurityWatcher
from sluice.v1 import acl_pb2 as pb

ALICE = Principal("alice", "scram")


def test_a_snapshot_replaces_the_set_users_first_and_skips_entries_it_cannot_read() -> None:
    authorizer = AclAuthorizer(AclSet())
    watcher = SecurityWatcher("127.0.0.1:1", authorizer)
    seen: list[tuple[int, dict[str, int]]] = []
    authorizer.on_change(lambda acls: seen.append((acls.version, dict(watcher.user_generations))))
    future = pb.AclEntry(
        principal="alice",
        resource_type="queue",  # a resource type of some later release
        pattern="literal",
        name="x",
        operation="read",
        permission="deny",
    )
    snapshot = pb.SecuritySnapshot(
        version=5,
        acls=[entry_to_proto(AclEntry.of("alice", "topic", "t", "read")), future],
        user_generations={"alice": 2},
    )
    watcher.apply(snapshot)
    assert watcher.version == authorizer.version == 5
    assert len(authorizer.acls) == 1
    assert authorizer.allowed(ALICE, Operation.READ, Resource(ResourceType.TOPIC, "t"))
    # The listener ran after the user generations were in place.
    assert seen == [(5, {"alice": 2})]

    watcher.apply(pb.SecuritySnapshot(version=6))
    assert not authorizer.allowed(ALICE, Operation.READ, Resource(ResourceType.TOPIC, "t"))
    assert watcher.user_generations == {}
