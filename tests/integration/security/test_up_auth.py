"""``sluice up --tls --auth`` end to end, as a new user would use it: the banner's credentials produce and
consume (fetch, group, push) through the SDK and the CLI; a second user made with ``sluice user add`` and
``sluice acl add`` reads its one topic and nothing else; anonymous callers are refused.

The coordinator's sessions last 3 s here (``SLUICE_COORDINATOR_SESSION_TOKEN_TTL``, the setting's
environment form), so every test runs across several session expiries: the servers end streams and
connections whose session expired, and the SDK must reconnect with a fresh session without failing the
user's calls (docs/security.md, "Clients: credentials in the SDK, CLI and Spark").
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice import AclEntry, Client, TLSConfig
from sluice.client.push import PushConsumer
from sluice.errors import AuthenticationError, AuthorizationError
from sluice.security.scram_login import ScramLogin
from tests.harness import ROOT, _env
from tests.integration.cli.test_cli_system import Up, start_up

pytestmark = pytest.mark.timeout(300)

SESSION_TTL_S = 3.0


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    os.environ["SLUICE_COORDINATOR_SESSION_TOKEN_TTL"] = f"{SESSION_TTL_S:g}s"
    try:
        stack = start_up(tmp_path_factory.mktemp("up-auth") / "data", "--tls", "--auth")
    finally:
        del os.environ["SLUICE_COORDINATOR_SESSION_TOKEN_TTL"]
    try:
        yield stack
    finally:
        stack.stop()


def _ca(up: Up) -> Path:
    return up.data_dir.resolve() / "tls" / "ca.crt"


def _admin_password(up: Up) -> str:
    return (up.data_dir / "admin.password").read_text().strip()


def _admin(up: Up, **kwargs: object) -> Client:
    return Client(
        up.bootstrap,
        request_timeout=15,
        tls=TLSConfig(ca=_ca(up)),
        username="admin",
        password=_admin_password(up),
        **kwargs,  # type: ignore[arg-type]
    )


def _cli(
    up: Up, *args: str, env: dict[str, str] | None = None, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "sluice", "--bootstrap", up.bootstrap, *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        env={**_env(), "SLUICE_TLS_CA": str(_ca(up)), **(env or {})},
        cwd=ROOT,
        check=False,
    )


def _received(pc: PushConsumer) -> list[bytes]:
    """What arrives within 0.1 s (acked), or nothing."""
    try:
        msg = pc.receive(timeout=0.1)
    except TimeoutError:
        return []
    pc.ack(msg)
    return [msg.value]


def _admin_env(up: Up) -> dict[str, str]:
    return {"SLUICE_USERNAME": "admin", "SLUICE_PASSWORD": _admin_password(up)}


def test_the_banner_says_how_to_connect_and_the_secrets_are_private(up: Up) -> None:
    data = up.data_dir.resolve()
    banner = "".join(up.stdout)
    expected = (
        f"export SLUICE_USERNAME=admin SLUICE_PASSWORD=$(cat {data / 'admin.password'}) "
        f"SLUICE_TLS_CA={data / 'tls' / 'ca.crt'}\n"
    )
    assert expected in banner
    for name in ("admin.password", "cluster.token"):
        assert oct((data / name).stat().st_mode & 0o777) == "0o600", name
    assert len(_admin_password(up)) >= 24


def test_admin_produces_and_consumes_by_fetch_group_and_push_across_session_expiries(up: Up) -> None:
    topic = f"e2e-{uuid.uuid4().hex[:6]}"
    with _admin(up) as client:
        login = client.security.token
        assert isinstance(login, ScramLogin)
        client.admin.create_topic(topic, partitions=2)
        group = client.consumer(
            f"g-{topic}", [topic], auto_offset_reset="earliest", session_timeout="6s", fetch_max_wait="100ms"
        )
        pc = client.push_consumer(topic, f"s-{topic}", "shared", initial_position="earliest")
        fetcher = client.fetcher({(topic, 0): 0, (topic, 1): 0}, max_wait_ms=100)
        fetched: list[bytes] = []
        grouped: list[bytes] = []
        pushed: list[bytes] = []
        sent = 0
        # Produce a little all the time for 3.5 session lifetimes, consuming all the while in the
        # three ways: every stream and connection outlives several sessions.
        with client.producer(topic, partitioner="round_robin", linger="1ms") as producer:
            end = time.monotonic() + 3.5 * SESSION_TTL_S
            while time.monotonic() < end:
                producer.send(str(sent).encode()).result(15)
                sent += 1
                time.sleep(0.02)
                fetched += [r.value for r in fetcher.fetch(timeout=0.1)]
                grouped += [r.value for r in group.poll(0.05)]
                pushed += _received(pc)
        deadline = time.monotonic() + 30
        while min(len(fetched), len(grouped), len(set(pushed))) < sent:
            assert time.monotonic() < deadline, (len(fetched), len(grouped), len(set(pushed)), sent)
            fetched += [r.value for r in fetcher.fetch(timeout=0.1)]
            grouped += [r.value for r in group.poll(0.05)]
            pushed += _received(pc)
        group.close()
        pc.close()
        fetcher.close()
        assert login.logins >= 3, f"{login.logins} logins: the sessions were not renewed"
    want = sorted(range(sent))
    assert sorted(int(v) for v in fetched) == want
    assert sorted(int(v) for v in grouped) == want
    assert sorted(int(v) for v in set(pushed)) == want  # push is at least once


def test_a_read_only_user_reads_its_topic_and_nothing_else(up: Up, tmp_path: Path) -> None:
    ro, other = f"ro-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"
    with _admin(up) as admin:
        admin.admin.create_topic(ro, partitions=1)
        admin.admin.create_topic(other, partitions=1)
        with admin.producer(ro) as p:
            p.send(b"visible").result(15)
        with admin.producer(other) as p:
            p.send(b"secret").result(15)
    password_file = tmp_path / "reader.password"
    password_file.write_text("reader-password-1\n")
    env = _admin_env(up)
    added = _cli(up, "user", "add", "reader", "--password-file", str(password_file), env=env)
    assert added.returncode == 0, added.stderr.decode()
    acl = _cli(up, "acl", "add", "--principal", "reader", "--topic", ro, "--operation", "read", env=env)
    assert acl.returncode == 0, acl.stderr.decode()
    time.sleep(1)  # the ACL reaches the brokers with the next security snapshot (milliseconds)

    tls = TLSConfig(ca=_ca(up))
    with Client(
        up.bootstrap, request_timeout=10, tls=tls, username="reader", password="reader-password-1"
    ) as c:
        got = c.fetcher({(ro, 0): 0}).fetch(timeout=10)
        assert [r.value for r in got] == [b"visible"]
        with pytest.raises(AuthorizationError), c.producer(ro) as p:
            p.send(b"nope").result(15)
        with pytest.raises(AuthorizationError):
            c.fetcher({(other, 0): 0}).fetch(timeout=10)
    # The CLI, logging in with --username and --password-file.
    consumed = _cli(
        up, "--username", "reader", "--password-file", str(password_file),
        "consume", ro, "--from", "earliest", "--max", "1",
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr.decode()
    assert consumed.stdout.decode().split() == ["visible"]
    refused = _cli(
        up, "produce", ro, "--username", "reader", "--password-file", str(password_file), stdin=b"x\n"
    )
    assert refused.returncode == 1
    assert "PERMISSION_DENIED" in refused.stderr.decode()


def test_anonymous_and_a_wrong_password_are_refused(up: Up) -> None:
    tls = TLSConfig(ca=_ca(up))
    with Client(up.bootstrap, request_timeout=5, tls=tls) as anonymous, pytest.raises(AuthenticationError):
        anonymous.admin.list_topics()
    with (
        Client(up.bootstrap, request_timeout=5, tls=tls, username="admin", password="wrong") as c,
        pytest.raises(AuthenticationError),
    ):
        c.admin.list_topics()
    plain = _cli(up, "--request-timeout", "3", "topic", "list")
    assert plain.returncode == 1
    assert "UNAUTHENTICATED" in plain.stderr.decode()


def test_the_cli_produces_and_consumes_with_the_banners_environment(up: Up, tmp_path: Path) -> None:
    topic = f"cli-{uuid.uuid4().hex[:6]}"
    env = _admin_env(up)
    created = _cli(up, "topic", "create", topic, "--partitions", "1", env=env)
    assert created.returncode == 0, created.stderr.decode()
    produced = _cli(up, "produce", topic, env=env, stdin=b"one\ntwo\n")
    assert produced.returncode == 0, produced.stderr.decode()
    password_file = tmp_path / "admin.pw"
    password_file.write_text(_admin_password(up))
    consumed = _cli(
        up, "--username", "admin", "--password-file", str(password_file),
        "consume", topic, "--from", "earliest", "--max", "2",
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr.decode()
    assert consumed.stdout.decode().split() == ["one", "two"]


def test_a_token_file_is_read_again_when_it_is_rotated(up: Up, tmp_path: Path) -> None:
    """The file holds a session token (as a projected ServiceAccount token would hold a JWT); the
    client sends whatever it holds now: the reader's token cannot create a topic, the admin's can."""
    tls = TLSConfig(ca=_ca(up))
    token_file = tmp_path / "token"
    token_file.write_text("not-a-valid-token\n")
    login = ScramLogin(up.bootstrap, "admin", _admin_password(up), tls)
    try:
        with Client(up.bootstrap, request_timeout=5, tls=tls, token_file=token_file) as c:
            with pytest.raises(AuthenticationError):
                c.admin.list_topics()
            token_file.write_text(login() + "\n")  # a fresh session: valid for 3 s
            deadline = time.monotonic() + SESSION_TTL_S
            while True:  # looked at again within a second
                try:
                    c.admin.create_topic(f"tf-{uuid.uuid4().hex[:6]}", partitions=1)
                    break
                except AuthenticationError:
                    assert time.monotonic() < deadline, "the rotated token file was never read again"
                    time.sleep(0.1)
    finally:
        login.close()


def test_a_refused_session_is_replaced_without_failing_the_users_calls(up: Up) -> None:
    """The login's clock runs 100 times slow, so it never renews a session on its own: every new
    session here comes from a server refusing the old one, expired (after 3 s) or revoked (the user's
    password set again). Unary calls are sent once more with a new session; a fetcher's wire
    connection, ended by the server, reconnects with one; no call fails."""
    tls = TLSConfig(ca=_ca(up))
    topic = f"refusal-{uuid.uuid4().hex[:6]}"
    with _admin(up) as admin:
        admin.admin.create_topic(topic, partitions=1)
        admin.admin.upsert_user("renewer", "renewer-password-1")
        admin.admin.create_acls([AclEntry.of("renewer", "topic", topic, "all")])
    time.sleep(1)  # the ACL reaches the broker
    login = ScramLogin(
        up.bootstrap, "renewer", "renewer-password-1", tls, clock=lambda: time.monotonic() / 100
    )
    with Client(up.bootstrap, request_timeout=15, tls=tls, token=login) as c:
        fetcher = c.fetcher({(topic, 0): 0}, max_wait_ms=100)
        got: list[bytes] = []
        with c.producer(topic, linger="1ms") as producer:
            end = time.monotonic() + 2.5 * SESSION_TTL_S
            sent = 0
            while time.monotonic() < end:  # across two expiries, refused and renewed
                producer.send(str(sent).encode()).result(15)
                sent += 1
                got += [r.value for r in fetcher.fetch(timeout=0.2)]
                assert c.admin.describe_topic(topic).name == topic
            expired_logins = login.logins
            assert expired_logins >= 3, f"{expired_logins} logins: refused sessions were not replaced"
            with _admin(up) as admin:  # the same password again: a new generation, its sessions end
                admin.admin.upsert_user("renewer", "renewer-password-1")
            deadline = time.monotonic() + SESSION_TTL_S  # (before the session would expire anyway)
            while login.logins == expired_logins:
                assert time.monotonic() < deadline, "the revoked session was never replaced"
                assert c.admin.describe_topic(topic).name == topic
                time.sleep(0.05)
        deadline = time.monotonic() + 20
        while len(got) < sent:
            assert time.monotonic() < deadline, f"fetched {len(got)} of {sent}"
            got += [r.value for r in fetcher.fetch(timeout=0.2)]
        fetcher.close()
    login.close()
    assert sorted(int(v) for v in got) == list(range(sent))


def test_auth_alone_keeps_the_admin_password_and_the_cluster_token_across_restarts(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    data = tmp_path_factory.mktemp("up-auth-restart") / "data"
    first = start_up(data, "--auth")
    try:
        password = (data / "admin.password").read_text()
        token = (data / "cluster.token").read_text()
        assert "SLUICE_TLS_CA" not in "".join(first.stdout)
        with Client(first.bootstrap, request_timeout=10, username="admin", password=password.strip()) as c:
            c.admin.create_topic("before-restart", partitions=1)
    finally:
        assert first.stop() == 0
    second = start_up(data, "--auth")
    try:
        assert (data / "admin.password").read_text() == password
        assert (data / "cluster.token").read_text() == token
        with Client(second.bootstrap, request_timeout=10, username="admin", password=password.strip()) as c:
            assert "before-restart" in [t.name for t in c.admin.list_topics()]
    finally:
        second.stop()
