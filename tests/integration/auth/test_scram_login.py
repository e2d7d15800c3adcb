"""SCRAM logins against a real coordinator: session tokens every service can verify, one answer for a wrong
password and an unknown user, throttling, generations, refresh and recovery of the SDK's ScramLogin."""

from __future__ import annotations

import asyncio
import base64
import threading
import time

import pytest
from redis.asyncio import Redis

from sluice import Client
from sluice.common.peers import Peers
from sluice.common.rpc import call
from sluice.coordinator.users import UserStore
from sluice.errors import AuthenticationError, InvalidArgument, SluiceError, Throttled
from sluice.security.scram import DEFAULT_ITERATIONS
from sluice.security.scram_login import ScramLogin, scram_login
from sluice.security.session_tokens import SessionTokens
from sluice.v1 import auth_pb2 as pb
from sluice.v1 import auth_pb2_grpc
from tests.harness import RedisServer, ServiceProcess, start_service
from tests.integration.auth.conftest import PER_USER, TTL_S, Coordinator, coordinator_args

ITERATIONS = 4096  # the minimum: these tests log in many times


def login_error(address: str, user: str, password: str) -> SluiceError:
    peers = Peers()
    try:
        scram_login(peers.stub(address, auth_pb2_grpc.AuthStub), user, password, timeout=10)
    except SluiceError as exc:
        return exc
    finally:
        peers.close()
    raise AssertionError("the login succeeded")


def generations(redis: RedisServer) -> dict[str, int]:
    async def read() -> dict[str, int]:
        client = Redis.from_url(redis.url)
        try:
            return await UserStore(client, "sluice").generations()
        finally:
            await client.aclose()

    return asyncio.run(read())


def test_a_login_returns_a_session_token_every_service_verifies(
    coordinator: Coordinator, client: Client
) -> None:
    change = client.admin.upsert_user("alice", "alice-password", ITERATIONS)
    login = ScramLogin(coordinator.address, "alice", "alice-password")
    try:
        token = login()
    finally:
        login.close()
    claims = coordinator.tokens().verify(token)  # a verifier built from the cluster token file alone
    assert claims is not None
    assert (claims.principal, claims.mechanism, claims.generation) == ("alice", "scram", change.generation)
    assert time.time() < claims.expires_at <= time.time() + TTL_S
    assert SessionTokens.from_cluster_token(b"another cluster").verify(token) is None


def test_wrong_password_and_unknown_user_get_the_same_answer(
    coordinator: Coordinator, client: Client
) -> None:
    client.admin.upsert_user("bob", "bob-password", ITERATIONS)
    wrong = login_error(coordinator.address, "bob", "not-bobs-password")
    unknown = login_error(coordinator.address, "nobody-at-all", "whatever")
    impossible = login_error(coordinator.address, "no,such=user", "whatever")
    for err in (wrong, unknown, impossible):
        assert isinstance(err, AuthenticationError)
    assert wrong.message == unknown.message == impossible.message


def test_wrong_passwords_at_full_rate_are_throttled_while_others_log_in(
    coordinator: Coordinator, client: Client
) -> None:
    client.admin.upsert_user("carol", "carol-password", ITERATIONS)
    client.admin.upsert_user("dave", "dave-password", ITERATIONS)
    outcomes: list[type[SluiceError]] = []
    throttled_s: list[float] = []
    for _ in range(20):
        started = time.perf_counter()
        err = login_error(coordinator.address, "carol", "guess")
        outcomes.append(type(err))
        if isinstance(err, Throttled):
            throttled_s.append(time.perf_counter() - started)
    assert outcomes[:PER_USER] == [AuthenticationError] * PER_USER
    assert outcomes[PER_USER:] == [Throttled] * (20 - PER_USER)
    assert sum(throttled_s) / len(throttled_s) < 0.5  # refused at once, no exchange
    # Carol's right password waits out the window too; another user from the same address logs in.
    assert isinstance(login_error(coordinator.address, "carol", "carol-password"), Throttled)
    login = ScramLogin(coordinator.address, "dave", "dave-password")
    try:
        assert coordinator.tokens().verify(login()) is not None
    finally:
        login.close()


def test_the_address_limit_throttles_every_user_from_it(redis_server: RedisServer) -> None:
    process = start_service(
        "coordinator", *coordinator_args(redis_server, "--login-failures-per-address", "8")
    )
    try:
        outcomes = [type(login_error(process.address, f"spray{i}", "guess")) for i in range(20)]
        assert outcomes[:8] == [AuthenticationError] * 8
        assert outcomes[8:] == [Throttled] * 12
    finally:
        process.terminate()


def test_password_change_and_delete_move_the_generation_on(coordinator: Coordinator, client: Client) -> None:
    created = client.admin.upsert_user("erin", "first", ITERATIONS)
    assert created.changed
    tokens = coordinator.tokens()
    login = ScramLogin(coordinator.address, "erin", "first")
    try:
        old_token = login()
    finally:
        login.close()
    old = tokens.verify_current(old_token, generations(coordinator.redis))
    assert old is not None
    assert old.generation == created.generation

    changed = client.admin.upsert_user("erin", "second", ITERATIONS)
    assert not changed.changed
    assert changed.generation == created.generation + 1
    assert tokens.verify(old_token) is not None  # still genuine and unexpired, but ...
    assert (
        tokens.verify_current(old_token, generations(coordinator.redis)) is None
    )  # ... of an old generation
    assert isinstance(login_error(coordinator.address, "erin", "first"), AuthenticationError)

    deleted = client.admin.delete_user("erin")
    assert deleted.changed
    assert deleted.generation == changed.generation + 1
    assert "erin" not in generations(coordinator.redis)
    assert tokens.verify_current(old_token, generations(coordinator.redis)) is None
    assert not client.admin.delete_user("erin").changed
    assert isinstance(login_error(coordinator.address, "erin", "second"), AuthenticationError)

    again = client.admin.upsert_user("erin", "first", ITERATIONS)
    assert again.changed
    assert again.generation == deleted.generation + 1  # never the generation an old token carries
    assert [u.generation for u in client.admin.list_users() if u.name == "erin"] == [again.generation]
    assert tokens.verify_current(old_token, generations(coordinator.redis)) is None  # not after re-creation


def test_scram_login_refreshes_before_the_session_expires(coordinator: Coordinator, client: Client) -> None:
    client.admin.upsert_user("frank", "frank-password", ITERATIONS)
    tokens = coordinator.tokens()
    login = ScramLogin(coordinator.address, "frank", "frank-password")
    try:
        first = login()
        seen = {first}
        deadline = time.monotonic() + 2.5 * TTL_S
        while time.monotonic() < deadline:
            token = login()
            assert tokens.verify(token) is not None, "handed out an expired token"
            seen.add(token)
            time.sleep(0.05)
        assert len(seen) >= 2
        assert login.logins >= 2
    finally:
        login.close()


def test_scram_login_recovers_after_a_coordinator_restart(redis_server: RedisServer, client: Client) -> None:
    # No cluster token: each coordinator process has its own key, so a restart refuses the old session.
    process = start_service("coordinator", *coordinator_args(redis_server))
    admin = Client(process.address, request_timeout=10)
    login = ScramLogin(process.address, "grace", "grace-password", timeout=30)
    try:
        admin.admin.upsert_user("grace", "grace-password", ITERATIONS)
        old = login()
        process.terminate()
        restarted: list[ServiceProcess] = []

        def restart() -> None:
            time.sleep(1.0)
            restarted.append(start_service("coordinator", *process.args))

        thread = threading.Thread(target=restart)
        thread.start()
        login.refused(old)  # what the SDK does when a call comes back UNAUTHENTICATED
        new = login()  # retries the unreachable coordinator until it is back
        thread.join(30)
        assert new != old
        assert login.logins == 2
    finally:
        login.close()
        admin.close()
        for p in [process, *restarted]:
            p.terminate()


def test_a_refusal_of_an_older_token_keeps_the_current_one(coordinator: Coordinator, client: Client) -> None:
    client.admin.upsert_user("heidi", "heidi-password", ITERATIONS)
    login = ScramLogin(coordinator.address, "heidi", "heidi-password")
    try:
        token = login()
        login.refused("sls1.some-older-token")
        assert login() == token
        assert login.logins == 1
    finally:
        login.close()


def test_async_callers_get_the_token_without_blocking_the_loop(
    coordinator: Coordinator, client: Client
) -> None:
    client.admin.upsert_user("ivan", "ivan-password", ITERATIONS)
    login = ScramLogin(coordinator.address, "ivan", "ivan-password")

    async def main() -> tuple[str, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        token = await login.fresh()
        task.cancel()
        return token, ticks

    try:
        token, ticks = asyncio.run(main())
        assert coordinator.tokens().verify(token) is not None
        assert ticks >= 1  # the loop ran while the login did
        assert login.valid_token() == token
    finally:
        login.close()


@pytest.mark.parametrize("bad", ["", "with space", "x" * 129])
def test_bad_user_names_are_refused_before_any_call(coordinator: Coordinator, bad: str) -> None:
    with pytest.raises(SluiceError) as info:
        ScramLogin(coordinator.address, bad, "pw")
    assert info.value.code_name == "INVALID_ARGUMENT"


def server_first(address: str, user: str) -> dict[str, str]:
    """The server-first message's attributes for ``user`` (the exchange is then abandoned)."""
    peers = Peers()
    try:
        stub = peers.stub(address, auth_pb2_grpc.AuthStub)
        first = pb.AuthMessage(mechanism="SCRAM-SHA-256", scram=f"n,,n={user},r=probe".encode())
        call = stub.Authenticate(iter([first]), timeout=10)
        try:
            answer = next(iter(call)).scram.decode()
        finally:
            call.cancel()
    finally:
        peers.close()
    return dict(p.split("=", 1) for p in answer.split(","))


def test_an_unknown_user_looks_like_a_known_one(coordinator: Coordinator, client: Client) -> None:
    client.admin.upsert_user("judy", "judy-password")  # the default iteration count
    known, ghost, ghost_again = (server_first(coordinator.address, u) for u in ("judy", "ghost", "ghost"))
    assert known["i"] == ghost["i"] == str(DEFAULT_ITERATIONS)
    assert len(base64.b64decode(known["s"])) == len(base64.b64decode(ghost["s"]))
    assert ghost["s"] == ghost_again["s"]  # a stable salt, as a real user's is
    assert ghost["s"] != server_first(coordinator.address, "ghost2")["s"]


def _credential(**change: object) -> pb.ScramCredential:
    fields: dict[str, object] = {
        "mechanism": "SCRAM-SHA-256",
        "salt": b"s" * 16,
        "iterations": 4096,
        "stored_key": b"k" * 32,
        "server_key": b"v" * 32,
    }
    fields.update(change)
    return pb.ScramCredential(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("request_", "named"),
    [
        (pb.UpsertUserRequest(name="ok-name"), "credential is required"),
        (pb.UpsertUserRequest(name="bad name", credential=_credential()), "invalid user name"),
        (pb.UpsertUserRequest(name="ok-name", credential=_credential(mechanism="PLAIN")), "mechanism"),
        (pb.UpsertUserRequest(name="ok-name", credential=_credential(salt=b"s")), "salt"),
        (pb.UpsertUserRequest(name="ok-name", credential=_credential(iterations=1)), "iterations"),
        (pb.UpsertUserRequest(name="ok-name", credential=_credential(stored_key=b"")), "stored_key"),
        (pb.UpsertUserRequest(name="ok-name", credential=_credential(server_key=b"x" * 64)), "server_key"),
    ],
)
def test_the_server_validates_every_field(
    coordinator: Coordinator, request_: pb.UpsertUserRequest, named: str
) -> None:
    peers = Peers()
    try:
        stub = peers.stub(coordinator.address, auth_pb2_grpc.AuthStub)
        with pytest.raises(InvalidArgument, match=named):
            call(stub.UpsertUser, request_, timeout=10)
        with pytest.raises(InvalidArgument, match="invalid user name"):
            call(stub.DeleteUser, pb.DeleteUserRequest(name=""), timeout=10)
    finally:
        peers.close()
