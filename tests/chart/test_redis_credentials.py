"""Redis is not a back door: the chart's Redis, run for real, lets Sluice in as its own ACL user only.

The redis-server arguments, redis.conf and the Sentinel start-up scripts are the ones the chart renders,
with the passwords of the Secret it renders; only the port, bind address and directories are local (and
the lone Sentinel-mode primary writes without the replica it would wait for). The
services connect the way they do in the cluster: ``sluice.common.redis_client.connect`` with the URL
from that Secret.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import AuthenticationError, NoPermissionError

from sluice.common.redis_client import connect
from tests.chart.chartlib import CHART, Manifest, one, render
from tests.chart.test_helm_test_script import run_helm_test_script, sluice_up_stack
from tests.harness import free_port

SENTINEL_VALUES = CHART / "ci" / "values-redis-sentinel.yaml"
# What Sluice's own code sends (coordinator/store.py, offsetstore/storage.py, the elector): it must pass.
SCRIPT = "return redis.call('INCR', KEYS[1])"
# What an intruder with Sluice's credentials would want: each must be refused.
REFUSED = [
    ("CONFIG", "SET", "dir", "/tmp"),
    ("FLUSHALL",),
    ("ACL", "LIST"),
    ("SAVE",),
    ("CLIENT", "KILL", "TYPE", "normal"),
    ("CONFIG", "GET", "*"),
    ("ACL", "SETUSER", "intruder", "on", ">x", "+@all"),
    ("REPLICAOF", "127.0.0.1", "1"),
    ("KEYS", "*"),
    ("SHUTDOWN", "NOSAVE"),
]


def _redis_server() -> str:
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not on PATH: install it (make deps does) to run the tests")
    return exe


def _secret(m: list[Manifest]) -> dict[str, str]:
    data = one(m, "Secret", "sluice-redis")["data"]
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def _local_conf(m: list[Manifest], directory: Path) -> Path:
    """The rendered redis.conf, listening on loopback with its data in ``directory``."""
    conf = one(m, "ConfigMap", "sluice-redis")["data"]["redis.conf"]
    conf = re.sub(r"(?m)^dir .*$", f"dir {directory}", conf)
    conf = re.sub(r"(?m)^bind .*$", "bind 127.0.0.1", conf)
    path = directory / "redis.conf"
    path.write_text(conf + "save ''\n")
    return path


def _wait_for_ping(port: int, password: str, proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"redis on {port} exited with {proc.returncode}")
        try:
            with redis.Redis(port=port, password=password, socket_timeout=1) as r:
                if r.ping():
                    return
        except (redis.ConnectionError, redis.TimeoutError):
            time.sleep(0.05)
    raise AssertionError(f"redis on {port} did not answer in {timeout}s")


@dataclass
class Running:
    url: str
    secret: dict[str, str]
    port: int


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """The bundled single-node Redis, started with the StatefulSet's own command line."""
    m = render()
    secret = _secret(m)
    directory = tmp_path_factory.mktemp("redis-acl")
    container = one(m, "StatefulSet", "sluice-redis")["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["redis-server"]
    env = {"REDIS_PASSWORD": secret["admin-password"], "SLUICE_REDIS_PASSWORD": secret["redis-password"]}
    # The kubelet's $(VAR) expansion, then the local port.
    args = [re.sub(r"\$\((\w+)\)", lambda g: env[g.group(1)], a) for a in container["args"]]
    args[0] = str(_local_conf(m, directory))
    port = free_port()
    proc = subprocess.Popen(
        [_redis_server(), *args, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_for_ping(port, secret["admin-password"], proc)
        url = secret["redis-url"].replace("sluice-redis:6379", f"127.0.0.1:{port}")
        yield Running(url, secret, port)
    finally:
        _stop(proc)


async def _close(client: aioredis.Redis) -> None:
    """Close the client and, for a Sentinel address, its connections to the Sentinels."""
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", []):
        await sentinel.aclose()
    await client.aclose()


async def _sluice_commands(client: aioredis.Redis) -> list[Any]:
    """One of every kind of command Sluice sends, through the services' own connect()."""
    try:
        sha = await client.script_load(SCRIPT)
        pipe = client.pipeline(transaction=True)
        pipe.set("sluice:test:a", b"1")
        pipe.evalsha(sha, 1, "sluice:test:n")
        pipe.execute_command("WAIT", 0, 0)
        pipe.time()
        results: list[Any] = await pipe.execute()
        results.append(await client.eval(SCRIPT, 1, "sluice:test:n"))
        results.append(await client.scan(0, match="sluice:test:*"))
        results.append((await client.info("replication"))["role"])
        results.append(await client.ping())
        return results
    finally:
        await _close(client)


def test_the_chart_gives_sluice_its_own_user_and_the_default_user_a_separate_password(
    single: Running,
) -> None:
    assert single.url.startswith(f"redis://sluice:{single.secret['redis-password']}@")
    assert single.secret["redis-password"] != single.secret["admin-password"]
    results = asyncio.run(_sluice_commands(connect(single.url)))
    assert (results[1], results[4]) == (1, 2), "the scripts ran"
    assert results[2] == 0, "WAIT answered"
    assert results[-2] == "master"
    assert results[-1] is True


@pytest.mark.parametrize("command", REFUSED, ids=lambda c: " ".join(c[:2]))
def test_sluices_user_cannot_run_what_would_take_over_redis(
    single: Running, command: tuple[str, ...]
) -> None:
    password = single.secret["redis-password"]
    with redis.Redis(port=single.port, username="sluice", password=password, socket_timeout=5) as r:
        with pytest.raises(NoPermissionError):
            r.execute_command(*command)
        assert r.ping(), "still connected and served after the refusal"


def test_no_password_or_a_wrong_one_is_refused(single: Running) -> None:
    with redis.Redis(port=single.port, socket_timeout=5) as anonymous, pytest.raises(AuthenticationError):
        anonymous.get("sluice:test:a")
    wrong = redis.Redis(port=single.port, username="sluice", password="guess", socket_timeout=5)
    # The default user is not open either: it takes the admin password, never Sluice's.
    crossed = redis.Redis(port=single.port, password=single.secret["redis-password"], socket_timeout=5)
    for client in (wrong, crossed):
        with client, pytest.raises(AuthenticationError):
            client.ping()
    with redis.Redis(port=single.port, password=single.secret["admin-password"], socket_timeout=5) as admin:
        assert admin.config_get("appendonly") == {"appendonly": "yes"}


def test_the_whole_stack_runs_as_the_acl_user(single: Running, tmp_path: Path) -> None:
    """Every script and command the coordinator, offset store and Redis elector send passes the user's
    rules: `sluice up` on the chart's Redis, the `helm test` script through topics, a group and a push
    subscription."""
    with sluice_up_stack(tmp_path, "--redis-url", single.url) as bootstrap:
        proc = run_helm_test_script(bootstrap, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "consumer group read 50" in proc.stdout
    assert proc.stdout.rstrip().endswith("PASS")
    with redis.Redis(port=single.port, password=single.secret["admin-password"], socket_timeout=5) as admin:
        assert admin.exists("sluice:coordinator:records"), "Sluice wrote its state, as the sluice user"


# ---- Sentinel: the rendered start-up scripts, run against loopback --------------------------------


def _script(m: list[Manifest], name: str, directory: Path, conf: Path) -> Path:
    """A rendered start-up script, reading its files from ``directory`` instead of the pod's mounts."""
    text = one(m, "ConfigMap", "sluice-redis")["data"][name]
    text = text.replace("/etc/redis/find-primary.sh", str(directory / "find-primary.sh"))
    text = text.replace("/etc/redis/redis.conf", str(conf))
    text = text.replace("conf=/sentinel/", f"conf={directory}/").replace("dir /sentinel", f"dir {directory}")
    path = directory / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    m = render([SENTINEL_VALUES])
    secret = _secret(m)
    data_dir, sentinel_dir = tmp_path_factory.mktemp("primary"), tmp_path_factory.mktemp("sentinel")
    redis_port, sentinel_port = free_port(), free_port()
    conf = _local_conf(m, data_dir)
    # One pod here, so no replica to wait for: the only other local change.
    conf.write_text(conf.read_text() + "min-replicas-to-write 0\n")
    containers = {
        c["name"]: c for c in one(m, "StatefulSet", "sluice-redis")["spec"]["template"]["spec"]["containers"]
    }
    env = dict(os.environ)
    for c in containers.values():
        for e in c["env"]:
            if "value" in e:
                env[e["name"]] = e["value"]
    env.update(
        REDIS_PASSWORD=secret["admin-password"],
        REDISCLI_AUTH=secret["admin-password"],
        SLUICE_REDIS_PASSWORD=secret["redis-password"],
        REDIS_PORT=str(redis_port),
        SENTINEL_PORT=str(sentinel_port),
        QUORUM="1",
    )
    for d in (data_dir, sentinel_dir):
        # One pod alone on loopback: it is the primary (find-primary.sh's answer on a first install).
        (d / "find-primary.sh").write_text("me=127.0.0.1\nprimary=127.0.0.1\n")
    procs = [
        subprocess.Popen(
            ["sh", str(_script(m, "start-redis.sh", data_dir, conf)), "--port", str(redis_port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]
    try:
        _wait_for_ping(redis_port, secret["admin-password"], procs[0])
        procs.append(
            subprocess.Popen(
                ["sh", str(_script(m, "start-sentinel.sh", sentinel_dir, conf))],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        _wait_for_ping(sentinel_port, secret["admin-password"], procs[1])
        hosts = re.search(r"@([^/]+)/", secret["redis-url"])
        assert hosts is not None
        url = secret["redis-url"].replace(hosts.group(1), f"127.0.0.1:{sentinel_port}")
        yield Running(url, secret, sentinel_port)
    finally:
        for proc in reversed(procs):
            _stop(proc)


def test_through_the_sentinels_sluice_logs_in_as_its_user_everywhere(sentinel: Running) -> None:
    assert sentinel.url.startswith("redis+sentinel://sluice:")
    assert sentinel.url.endswith("?sentinel_auth=yes")
    results = asyncio.run(_sluice_commands(connect(sentinel.url)))
    assert results[-2] == "master"


def test_the_sentinels_refuse_strangers_and_sluice_may_only_ask(sentinel: Running) -> None:
    anonymous = redis.Redis(port=sentinel.port, socket_timeout=5)
    with anonymous, pytest.raises(AuthenticationError):
        anonymous.ping()
    password = sentinel.secret["redis-password"]
    with redis.Redis(port=sentinel.port, username="sluice", password=password, socket_timeout=5) as r:
        assert r.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "sluice")
        for command in (("SENTINEL", "SET", "sluice", "quorum", "5"), ("SENTINEL", "REMOVE", "sluice")):
            with pytest.raises(NoPermissionError):
                r.execute_command(*command)
        with pytest.raises(NoPermissionError):
            r.execute_command("SENTINEL", "MONITOR", "evil", "127.0.0.1", "1", "1")
    # Without sentinel_auth the services would ask the Sentinels anonymously, and be refused.
    bare = sentinel.url.removesuffix("?sentinel_auth=yes")

    async def refused() -> None:
        client = connect(bare, retries=0)
        try:
            with pytest.raises(MasterNotFoundError, match="AuthenticationError"):
                await client.ping()
        finally:
            await _close(client)

    asyncio.run(refused())
