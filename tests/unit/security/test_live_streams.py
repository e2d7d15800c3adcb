"""Live streams in-process: a stream is ended when its credentials expire, when an ACL change takes
a right it used, or when its user's credentials change; one that keeps its rights goes on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from sluice.errors import AuthorizationError, CredentialsExpired, SluiceError
from sluice.security.acl import AclAuthorizer, AclEntry, AclSet, PatternType, Permission
from sluice.security.audit import audit_denied
from sluice.security.context import GRPC, RequestContext
from sluice.security.enforce import ServiceAuthorizer
from sluice.security.live_streams import LiveStream, LiveStreams
from sluice.security.model import Operation, Principal, Resource, ResourceType

ORDERS = Resource(ResourceType.TOPIC, "orders")
AUDIT = lambda p, o, r, a: audit_denied(p, o, r, a, "test")  # noqa: E731


def read_acl(principal: str, topic: str) -> AclEntry:
    return AclEntry(
        principal, ResourceType.TOPIC, PatternType.LITERAL, topic, Operation.READ, Permission.ALLOW
    )


def context_of(stream: LiveStream) -> RequestContext:
    return RequestContext(stream.principal, GRPC, stream=stream)


def test_expiry_ends_a_stream_with_a_retriable_error() -> None:
    async def scenario() -> list[SluiceError]:
        ended: list[SluiceError] = []
        streams = LiveStreams()
        streams.open(Principal("bob"), "127.0.0.1:1", time.time() + 0.1, None, ended.append)
        kept = streams.open(Principal("carol"), "127.0.0.1:2", time.time() + 0.1, None, ended.append)
        streams.close(kept)  # ended on its own before: its timer must not fire
        await asyncio.sleep(0.3)
        assert len(streams) == 0
        return ended

    ended = asyncio.run(scenario())
    assert len(ended) == 1
    assert isinstance(ended[0], CredentialsExpired)
    assert ended[0].retriable


def test_an_acl_change_ends_only_the_streams_that_lost_a_right() -> None:
    async def scenario() -> None:
        acls = AclAuthorizer(AclSet([read_acl("bob", "orders"), read_acl("carol", "orders")], 1))
        authorizer = ServiceAuthorizer(acls, AUDIT)
        streams = LiveStreams()
        ended: dict[str, SluiceError] = {}

        def ender(name: str) -> Callable[[SluiceError], None]:
            def end(err: SluiceError) -> None:
                ended[name] = err

            return end

        bob = streams.open(Principal("bob"), "a", None, None, ender("bob"))
        carol = streams.open(Principal("carol"), "b", None, None, ender("carol"))
        for stream in (bob, carol):
            authorizer.authorize(context_of(stream), Operation.READ, ORDERS)  # remembered on the stream
        assert streams.recheck(authorizer, context_of) == 0
        acls.replace(AclSet([read_acl("carol", "orders")], 2))
        assert streams.recheck(authorizer, context_of) == 1
        assert isinstance(ended["bob"], AuthorizationError)
        assert "read topic:orders" in ended["bob"].message
        assert "carol" not in ended
        assert len(streams) == 1

    asyncio.run(scenario())


def test_a_credential_check_that_fails_ends_the_stream() -> None:
    async def scenario() -> None:
        valid = [True]
        ended: list[SluiceError] = []
        streams = LiveStreams()
        streams.open(
            Principal("dave"),
            "c",
            None,
            lambda: None if valid[0] else CredentialsExpired("password changed"),
            ended.append,
        )
        authorizer = ServiceAuthorizer(AclAuthorizer(AclSet([], 1)), AUDIT)
        assert streams.recheck(authorizer, context_of) == 0
        valid[0] = False
        assert streams.recheck(authorizer, context_of) == 1
        assert isinstance(ended[0], CredentialsExpired)

    asyncio.run(scenario())


def test_a_dead_letter_topic_is_read_under_its_subscriptions_acl() -> None:
    """``<topic>.<subscription>.DLQ``: read, describe and delete follow the subscription's ACLs; writing
    does not (only the dispatcher, as the cluster, writes dead letters)."""
    sub_read = AclEntry(
        "bob", ResourceType.SUBSCRIPTION, PatternType.LITERAL, "billing.v2", Operation.READ, Permission.ALLOW
    )
    authorizer = ServiceAuthorizer(AclAuthorizer(AclSet([sub_read], 1)), AUDIT)
    ctx = RequestContext(Principal("bob"), GRPC)
    dlq = Resource(ResourceType.TOPIC, "orders.eu.billing.v2.DLQ")  # dots in both names
    assert authorizer.allowed(ctx, Operation.READ, dlq)
    assert authorizer.allowed(ctx, Operation.DESCRIBE, dlq)  # read implies describe
    assert not authorizer.allowed(ctx, Operation.WRITE, dlq)
    assert not authorizer.allowed(ctx, Operation.READ, Resource(ResourceType.TOPIC, "orders.eu.other.DLQ"))
    assert not authorizer.allowed(ctx, Operation.READ, Resource(ResourceType.TOPIC, "orders.eu.billing.v2"))
    # What `sluice dlq redrive --subscription billing.v2` writes back, for that subscription's readers only.
    redrive = Resource(ResourceType.TOPIC, "orders.eu.billing.v2.REDRIVE")
    assert authorizer.allowed(ctx, Operation.READ, redrive)
    assert not authorizer.allowed(ctx, Operation.WRITE, redrive)
    other = Resource(ResourceType.TOPIC, "orders.eu.other.REDRIVE")
    assert not authorizer.allowed(ctx, Operation.READ, other)
