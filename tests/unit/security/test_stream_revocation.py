"""The interceptor ends a live gRPC stream from outside, with a typed status, and leaves the others:
an ACL change that takes the stream's right away (PERMISSION_DENIED), its token expiring
(CREDENTIALS_EXPIRED). In-process, over a real gRPC server and channel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from sluice.common.rpc import error_from_rpc
from sluice.errors import AuthorizationError, CredentialsExpired
from sluice.security.acl import AclAuthorizer, AclEntry, AclSet, PatternType, Permission
from sluice.security.audit import audit_denied
from sluice.security.authenticate import ServerAuthenticator
from sluice.security.enforce import ServiceAuthorizer
from sluice.security.model import Operation, Principal, Resource, ResourceType
from sluice.security.service import ServiceSecurity
from sluice.security.session_tokens import SessionTokens
from sluice.server.runtime import GrpcServer

SESSIONS = SessionTokens.from_cluster_token(b"the-cluster-token-of-this-test")
METHOD = "/test.Echo/Stream"  # not in the guard table: cluster_action on the cluster


def _audit(p: Principal, o: Operation, r: Resource, a: str) -> None:
    audit_denied(p, o, r, a, "test")


def cluster_action(principal: str) -> AclEntry:
    return AclEntry(
        principal, ResourceType.CLUSTER, PatternType.LITERAL, "*", Operation.CLUSTER_ACTION, Permission.ALLOW
    )


def _echo(server: grpc.aio.Server) -> None:
    async def stream(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    handler = grpc.stream_stream_rpc_method_handler(stream)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {"Stream": handler}),))


async def _open(channel: grpc.aio.Channel, token: str) -> tuple[asyncio.Queue[bytes | None], object]:
    outgoing: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def requests() -> AsyncIterator[bytes]:
        while (item := await outgoing.get()) is not None:
            yield item

    call = channel.stream_stream(METHOD, None, None)(
        requests(), metadata=(("authorization", f"Bearer {token}"),)
    )
    return outgoing, call


async def _echo_once(outgoing: asyncio.Queue[bytes | None], call: object, payload: bytes) -> bytes:
    await outgoing.put(payload)
    answer: bytes = await asyncio.wait_for(call.read(), 5)  # type: ignore[attr-defined]
    return answer


def test_revoking_a_right_ends_that_stream_and_only_that_one() -> None:
    async def scenario() -> None:
        acls = AclAuthorizer(AclSet([cluster_action("bob"), cluster_action("carol")], 1))
        authenticator = ServerAuthenticator(mechanisms=frozenset({"scram"}), sessions=SESSIONS)
        security = ServiceSecurity("test", authenticator, ServiceAuthorizer(acls, _audit), acls=acls)

        def changed(_acls: AclSet) -> None:
            security.recheck_streams()

        acls.on_change(changed)
        server = GrpcServer("revoke-test", [_echo], metrics_port=None, security=security)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                bob_out, bob = await _open(channel, SESSIONS.mint("bob", "scram", 1, 60))
                carol_out, carol = await _open(channel, SESSIONS.mint("carol", "scram", 1, 60))
                assert await _echo_once(bob_out, bob, b"b1") == b"b1"
                assert await _echo_once(carol_out, carol, b"c1") == b"c1"
                acls.replace(AclSet([cluster_action("carol")], 2))
                with pytest.raises(grpc.aio.AioRpcError) as ended:
                    await asyncio.wait_for(bob.read(), 5)  # type: ignore[attr-defined]
                assert ended.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert isinstance(error_from_rpc(ended.value), AuthorizationError)
                assert await _echo_once(carol_out, carol, b"c2") == b"c2"
                await carol_out.put(None)
        finally:
            await server.stop(0)

    asyncio.run(scenario())


def test_a_stream_is_ended_when_its_token_expires() -> None:
    async def scenario() -> None:
        acls = AclAuthorizer(AclSet([cluster_action("dave")], 1))
        authenticator = ServerAuthenticator(mechanisms=frozenset({"scram"}), sessions=SESSIONS)
        security = ServiceSecurity("test", authenticator, ServiceAuthorizer(acls, _audit), acls=acls)
        server = GrpcServer("expiry-test", [_echo], metrics_port=None, security=security)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                out, call = await _open(channel, SESSIONS.mint("dave", "scram", 1, 1.0))
                assert await _echo_once(out, call, b"d1") == b"d1"
                started = asyncio.get_running_loop().time()
                with pytest.raises(grpc.aio.AioRpcError) as ended:
                    await asyncio.wait_for(call.read(), 5)  # type: ignore[attr-defined]
                assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert isinstance(error_from_rpc(ended.value), CredentialsExpired)
                assert asyncio.get_running_loop().time() - started < 3
        finally:
            await server.stop(0)

    asyncio.run(scenario())
