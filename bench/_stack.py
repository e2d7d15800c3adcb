"""Start a coordinator + broker (+ private Redis) for a benchmark, as real processes.

``stack(push=True)`` also starts the offset store and a dispatcher (push subscriptions).
``stack(tls=True)`` serves TLS on every port (a private CA in the stack's directory) and sets
``SLUICE_TLS_CA`` in this process's environment, so every SDK client of the benchmark (and the
processes it spawns) connects over TLS with no change of its own.
``stack(auth=True)`` turns authentication (``scram,jwt``) and ACL authorization on in every service, with
a cluster token, and grants the bench principal (``bench``, not a super user: the point is the ACL
decision path) literal ACLs on the benchmarks' topics, groups and subscriptions; it sets ``SLUICE_TOKEN``
to a JWT for that principal the same way, so the clients authenticate with no change of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "services"))
sys.path.insert(0, str(ROOT))

from tests.harness import ServiceProcess, free_port, run_redis, start_service  # noqa: E402

from sluice.security import certs  # noqa: E402

RESULTS = ROOT / "bench" / "results"

#: The principal the benchmarks' clients are with ``auth=True``, and the JWT issuer the services trust.
PRINCIPAL = "bench"
ISSUER = "sluice-bench"
#: The resources every benchmark script uses, granted to PRINCIPAL as literal ACLs (operation, names).
BENCH_TOPICS = ("bench", "bench-mixed", "push-bench", "push-latency")
BENCH_GROUPS = ("g-backlog", "g-mixed")
BENCH_SUBSCRIPTIONS = ("bench", "lat")
TOPIC_OPERATIONS = ("create", "write", "read")
GROUP_OPERATIONS = ("read",)
SUBSCRIPTION_OPERATIONS = ("read",)


@dataclass
class StackAuth:
    """What a benchmark needs to be someone with ``auth=True``: the cluster token (the ``cluster``
    principal, which passes every check), the JWT signing key the services trust, and the bench
    principal's token (also in ``SLUICE_TOKEN``)."""

    cluster_token: str
    jwt_key: Any  # an EllipticCurvePrivateKey
    token: str
    acl_entries: int = 0

    def sign(self, principal: str = PRINCIPAL, ttl_s: float = 6 * 3600) -> str:
        """A fresh JWT (ES256) every service accepts, naming ``principal``; a new ``jti`` each time, so
        two tokens signed in the same second differ (the services' token cache keys on the string)."""
        import jwt

        now = int(time.time())
        claims = {
            "iss": ISSUER, "aud": "sluice", "sub": principal, "iat": now, "exp": now + int(ttl_s),
            "jti": secrets.token_hex(8),
        }  # fmt: skip
        return jwt.encode(claims, self.jwt_key, algorithm="ES256")


@dataclass
class Stack:
    bootstrap: str
    broker: ServiceProcess
    coordinator: ServiceProcess
    data_dir: Path
    extra: tuple[ServiceProcess, ...] = ()
    auth: StackAuth | None = None
    services: list[ServiceProcess] = field(default_factory=list)


def _auth_files(d: Path) -> tuple[StackAuth, tuple[str, ...]]:
    """The signing key, the cluster token file and the flags every service gets with ``auth=True``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    public = d / "jwt.pub.pem"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    cluster_token = secrets.token_urlsafe(32)
    token_file = d / "cluster.token"
    token_file.write_text(cluster_token + "\n")
    token_file.chmod(0o600)
    auth = StackAuth(cluster_token, key, "")
    auth.token = auth.sign()
    args = (
        *("--auth-mechanisms", "scram,jwt", "--authorization", "acl"),
        *("--jwt-public-key-file", str(public), "--jwt-algorithms", "ES256", "--jwt-issuer", ISSUER),
        *("--cluster-token-file", str(token_file)),
    )
    return auth, args


def _grant_bench_acls(s: Stack) -> None:
    """Literal allows for PRINCIPAL on the bench resources, made as the cluster; then wait until every
    service applied that security version (before it, they refuse the bench principal)."""
    from sluice import AclEntry, Client

    assert s.auth is not None
    entries = [
        AclEntry.of(PRINCIPAL, kind, name, op)
        for kind, names, ops in (
            ("topic", BENCH_TOPICS, TOPIC_OPERATIONS),
            ("group", BENCH_GROUPS, GROUP_OPERATIONS),
            ("subscription", BENCH_SUBSCRIPTIONS, SUBSCRIPTION_OPERATIONS),
        )
        for name in names
        for op in ops
    ]
    with Client(s.bootstrap, token=s.auth.cluster_token) as admin:
        version = admin.admin.create_acls(entries)
    s.auth.acl_entries = len(entries)
    deadline = time.monotonic() + 30
    for sp in s.services:
        if sp is s.coordinator:
            continue  # it holds what it wrote
        while _security_version(sp) < version:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sp.service} did not apply security version {version}")
            time.sleep(0.05)


def _security_version(sp: ServiceProcess) -> int:
    with urllib.request.urlopen(f"http://{sp.metrics}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.search(r"^sluice_security_version (\S+)$", text, re.M)
    return int(float(found.group(1))) if found else -1


@contextlib.contextmanager
def stack(
    flush: str = "interval",
    extra_broker_args: tuple[str, ...] = (),
    push: bool = False,
    redis_fsync: str = "off",
    tls: bool = False,
    auth: bool = False,
    extra_coordinator_args: tuple[str, ...] = (),
) -> Iterator[Stack]:
    """The services on loopback over a private Redis; ``redis_fsync``: ``off`` (no AOF), or the
    ``appendfsync`` policy to run its AOF with (``always``, as `sluice up` does, or ``everysec``).
    ``tls``/``auth``: see the module docstring."""
    with (
        run_redis(
            appendonly=redis_fsync != "off", appendfsync="always" if redis_fsync == "off" else redis_fsync
        ) as redis,
        tempfile.TemporaryDirectory(prefix="sluice-bench-") as d,
        contextlib.ExitStack() as running,
    ):
        ca = certs.write_ca(Path(d) / "tls") if tls else None

        def tls_args(name: str) -> tuple[str, ...]:
            if ca is None:
                return ()
            issued = certs.issue(ca, Path(d) / "tls", name)
            return (
                "--tls-cert",
                str(issued.cert_path),
                "--tls-key",
                str(issued.key_path),
                "--tls-ca",
                str(ca.cert_path),
            )

        if ca is not None:
            os.environ["SLUICE_TLS_CA"] = str(ca.cert_path)
            running.callback(os.environ.pop, "SLUICE_TLS_CA", None)
        bench_auth, auth_args = _auth_files(Path(d)) if auth else (None, ())
        if bench_auth is not None:
            os.environ["SLUICE_TOKEN"] = bench_auth.token
            running.callback(os.environ.pop, "SLUICE_TOKEN", None)

        def security_args(name: str) -> tuple[str, ...]:
            return (*tls_args(name), *auth_args)

        def started(sp: ServiceProcess) -> ServiceProcess:
            # Stopped on the way out even when a later service fails to start (no leaked processes).
            running.callback(sp.terminate)
            return sp

        store_port = free_port()
        store_args = ("--offset-store", f"127.0.0.1:{store_port}") if push else ()
        coord = started(
            start_service(
                "coordinator",
                "--port",
                "0",
                "--metrics-port",
                "0",
                "--redis-url",
                redis.url,
                *store_args,
                *extra_coordinator_args,
                *security_args("coordinator"),
            )
        )
        broker = started(
            start_service(
                "broker", "--port", "0", "--metrics-port", "0", "--broker-id", "0",
                "--data-dir", str(Path(d) / "broker"), "--coordinator", coord.address,
                "--flush", flush, *extra_broker_args, *security_args("broker"),
            )
        )  # fmt: skip
        extra: list[ServiceProcess] = []
        if push:
            extra.append(
                started(
                    start_service(
                        "offset-store", "--port", str(store_port), "--metrics-port", "0",
                        "--redis-url", redis.url, "--coordinator", coord.address,
                        *security_args("offset-store"),
                    )
                )
            )  # fmt: skip
            extra.append(
                started(
                    start_service(
                        "dispatcher", "--port", "0", "--metrics-port", "0", "--coordinator", coord.address,
                        "--dispatcher-id", "bench", *security_args("dispatcher"),
                    )
                )
            )  # fmt: skip
        s = Stack(coord.address, broker, coord, Path(d), tuple(extra), bench_auth, [coord, broker, *extra])
        if bench_auth is not None:
            _grant_bench_acls(s)
        yield s


VALUE = b"x" * 100


def producer_overrides() -> dict[str, Any]:
    """ProducerConfig overrides from ``SLUICE_BENCH_PRODUCER`` (``acks=1,enable_idempotence=false``).

    Why: an A/B against a tree from before the idempotent producer must send the same way in both trees;
    the old tree ignores the variable, so setting it makes the new tree send as the old one did.
    """
    overrides: dict[str, Any] = {}
    for item in filter(None, os.environ.get("SLUICE_BENCH_PRODUCER", "").split(",")):
        name, _, raw = item.partition("=")
        value: Any = {"true": True, "false": False}.get(raw.lower(), raw)
        if isinstance(value, str) and value.lstrip("-").isdigit():
            value = int(value)
        overrides[name.strip()] = value
    return overrides


def produce_keyed(bootstrap: str, topic: str, n: int) -> float:
    """Send n records of 100 B with 16-byte keys through the SDK; return the seconds taken (incl. flush)."""
    import time

    from sluice import Client

    keys = [os.urandom(8).hex().encode() for _ in range(1024)]
    with Client(bootstrap) as client:
        producer = client.producer(topic, **producer_overrides())
        started = time.perf_counter()
        send = producer.send
        for i in range(n):
            send(VALUE, key=keys[i & 1023])
        producer.flush()
        elapsed = time.perf_counter() - started
        producer.close()
    return elapsed


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def calibration_ms() -> float:
    """How long a fixed single-threaded Python workload takes now (median of 5), in ms.

    The machines benches run on are shared VMs whose speed drifts by a quarter or more within
    an hour; every figure here is CPU-bound Python. Saved with each result, it tells whether two
    results differ because the code did or because the machine did.
    """

    def work() -> int:
        total = 0
        table: dict[int, int] = {}
        for i in range(200_000):
            table[i & 1023] = i
            total += table.get(i & 511, 0) & 7
        return total

    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        work()
        runs.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(runs), 1)


def save(name: str, data: dict[str, object]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {"machine": f"{os.cpu_count()} cores", "calibration_ms": calibration_ms(), **data}
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(data, indent=2))


class StreamMember(Protocol):
    """A benchmark's group member heartbeating on ``Coordinator.ConsumerGroupStream``."""

    answer: asyncio.Future[Any] | None
    wake: asyncio.Event | None
    nudges: int


async def read_group_stream(m: StreamMember, call: Any) -> None:
    """The member's stream reader: an answer resolves the heartbeat in flight, ``heartbeat_now``
    wakes the member; a stream that fails or ends fails the heartbeat in flight."""
    from sluice.v1 import coordinator_pb2

    error: Exception = ConnectionError("the coordinator ended the stream")
    try:
        # read() answers a response or grpc.aio.EOF when the coordinator ends the call.
        while isinstance(message := await call.read(), coordinator_pb2.GroupStreamResponse):
            if message.WhichOneof("kind") == "heartbeat_now":
                m.nudges += 1
                assert m.wake is not None
                m.wake.set()
            elif m.answer is not None and not m.answer.done():
                m.answer.set_result(message.heartbeat)
    except Exception as exc:
        error = exc
    if m.answer is not None and not m.answer.done():
        m.answer.set_exception(error)
