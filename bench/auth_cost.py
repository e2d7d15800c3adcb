"""The cost of authentication: new authenticated connections at a fixed rate; wrong passwords at full rate.

    .venv/bin/python bench/auth_cost.py --rate 1000 --duration 5

One stack with authentication and ACL authorization on (``_stack.stack(auth=True)``; ``--tls`` adds TLS).

1. ``connections``: ``--rate`` new connections per second for ``--duration`` s, opened on a fixed
   schedule (open loop) by ``--clients`` processes, against

   - the broker's wire port: TCP (and TLS) connect, the hello carrying the token, its answer;
   - the coordinator's gRPC port: a new channel (its own subchannel, so a new TCP connection), one
     ``Metadata`` call carrying the token, the answer;

   each with three kinds of token: ``session`` (from one SCRAM login, done once), ``jwt`` (one JWT for
   every connection: after the first, the services' verified-token cache answers) and ``jwt_fresh``
   (a new JWT per connection, signed beforehand: every connection pays the signature check); and, as
   the baseline, ``anonymous``: the same connections without a token to a stack without authentication
   (``--skip-baseline`` leaves it out). Figures:
   the rate achieved, p50/p99 of connect + first answer, refusals, and the service's CPU (share of one
   core, and per connection).
2. ``flood``: wrong passwords for the bench user at full rate on the coordinator's ``Auth.Authenticate``
   from ``--flood-processes`` processes (``scram_logins.hammer``, ``--flood-concurrency`` exchanges each),
   while an authenticated client (its session token from a SCRAM login made before) calls ``Metadata``
   on the coordinator and produces one record at a time (linger 0, waiting for each ack) to the broker
   every 10 ms. Its p50/p99 before and during the flood, the attempts answered ``THROTTLED`` (gRPC
   ``RESOURCE_EXHAUSTED``) and ``UNAUTHENTICATED``, and the coordinator's CPU; once with the default
   failed-login limits and once with them out of the way (every attempt a whole SCRAM exchange).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import threading
import time
from multiprocessing.queues import Queue
from typing import Any

import grpc
from grpc import aio

from _stack import Stack, cpu_seconds, save, stack
from scram_logins import ITERATIONS, PASSWORD, USER, FastClient, hammer
from sluice import Client
from sluice.common.client_security import TLSConfig
from sluice.common.client_tls import channel_credentials, client_ssl_context, server_hostname
from sluice.common.wire import HEADER, PROTOCOL_VERSION, FrameType, frame
from sluice.v1 import auth_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc, wire_pb2

TOPIC = "bench"
PROBE_INTERVAL = 0.01
#: New connections a client process keeps in flight at most; one more due is counted as missed.
MAX_IN_FLIGHT = 256


def percentiles(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {"n": 0}
    ms = sorted(ms)
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3),
        "max_ms": round(ms[-1], 3),
    }


# ---- 1. new connections ------------------------------------------------------------------------


async def wire_connection(host: str, port: int, token: str, tls: TLSConfig | None) -> None:
    """Connect, send the hello with the token, read its answer; raise on a refusal."""
    ssl_ctx = client_ssl_context(tls) if tls is not None else None
    reader, writer = await asyncio.open_connection(
        host, port, ssl=ssl_ctx, server_hostname=server_hostname(tls, host) if tls is not None else None
    )
    try:
        hello = wire_pb2.WireHello(version=PROTOCOL_VERSION, client_id="auth-cost", metadata=bearer(token))
        writer.write(frame(FrameType.HELLO, hello.SerializeToString()))
        length, kind = HEADER.unpack(await reader.readexactly(HEADER.size))
        payload = await reader.readexactly(length - 1)
        if kind != FrameType.HELLO:
            raise ConnectionError(f"refused (frame type {kind})")
        answer = wire_pb2.WireHelloResponse.FromString(payload)
        if answer.error.code:
            raise ConnectionError(f"refused (error code {answer.error.code})")
    finally:
        writer.close()


async def grpc_connection(address: str, token: str, tls: TLSConfig | None) -> None:
    """A new channel with its own subchannel (gRPC shares TCP connections between channels by default),
    one Metadata call with the token."""
    options = (("grpc.use_local_subchannel_pool", 1),)
    channel = (
        aio.secure_channel(address, channel_credentials(tls), options=options)
        if tls is not None
        else aio.insecure_channel(address, options=options)
    )
    async with channel:
        stub: coordinator_pb2_grpc.CoordinatorAsyncStub = coordinator_pb2_grpc.CoordinatorStub(channel)
        await stub.Metadata(
            coordinator_pb2.MetadataRequest(topics=[TOPIC]), metadata=tuple(bearer(token).items()), timeout=10
        )


def bearer(token: str) -> dict[str, str]:
    """The token's metadata; none for "" (the baseline: a stack without authentication)."""
    return {"authorization": f"Bearer {token}"} if token else {}


async def open_loop(
    target: str, address: str, tokens: list[str], rate: float, duration: float, tls: TLSConfig | None
) -> dict[str, Any]:
    """Start one connection every 1/rate s (whatever the answers' pace) for ``duration`` s."""
    host, _, port = address.rpartition(":")
    latencies: list[float] = []
    errors: dict[str, int] = {}
    in_flight: set[asyncio.Task[None]] = set()
    missed = 0

    async def one(token: str) -> None:
        started = time.perf_counter()
        try:
            if target == "wire":
                await wire_connection(host, int(port), token, tls)
            else:
                await grpc_connection(address, token, tls)
            latencies.append((time.perf_counter() - started) * 1000)
        except Exception as exc:
            name = exc.code().name if isinstance(exc, aio.AioRpcError) else type(exc).__name__
            errors[name] = errors.get(name, 0) + 1

    total = int(rate * duration)
    begin = time.perf_counter()
    for i in range(total):
        due = begin + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(in_flight) >= MAX_IN_FLIGHT:
            missed += 1
            continue
        task = asyncio.create_task(one(tokens[i % len(tokens)]))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    opened = time.perf_counter() - begin
    if in_flight:
        await asyncio.wait(in_flight, timeout=30)
    return {"latencies": latencies, "errors": errors, "missed": missed, "opened_s": opened}


def connection_client(
    target: str,
    address: str,
    tokens: list[str],
    rate: float,
    duration: float,
    tls: TLSConfig | None,
    start_at: float,
    out: Queue[Any],
) -> None:
    time.sleep(max(0.0, start_at - time.time()))
    out.put(asyncio.run(open_loop(target, address, tokens, rate, duration, tls)))


def connections_phase(
    target: str, address: str, pid: int, tokens: list[str], opts: argparse.Namespace, tls: TLSConfig | None
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    share = len(tokens) // opts.clients
    start_at = time.time() + 2.0  # every client process up and imported first
    procs = [
        ctx.Process(
            target=connection_client,
            args=(
                target,
                address,
                tokens[i * share : (i + 1) * share] if share else tokens,
                opts.rate / opts.clients,
                opts.duration,
                tls,
                start_at,
                out,
            ),
        )
        for i in range(opts.clients)
    ]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start_at - time.time()))
    cpu = cpu_seconds(pid)
    t0 = time.perf_counter()
    parts = [out.get(timeout=opts.duration + 120) for _ in procs]
    elapsed = time.perf_counter() - t0
    cpu = cpu_seconds(pid) - cpu
    for p in procs:
        p.join()
    latencies = [x for part in parts for x in part["latencies"]]
    errors: dict[str, int] = {}
    for part in parts:
        for name, count in part["errors"].items():
            errors[name] = errors.get(name, 0) + count
    ok = len(latencies)
    return {
        "target_rate": opts.rate,
        "connections_ok": ok,
        "refused_or_failed": errors,
        "missed_over_in_flight_cap": sum(part["missed"] for part in parts),
        "achieved_per_s": round(ok / elapsed),
        "latency": percentiles(latencies),
        "service_cpu_share": round(cpu / elapsed, 3),
        "service_cpu_us_per_connection": round(cpu / max(ok, 1) * 1e6, 1),
    }


def broker_wire_address(s: Stack, tls: TLSConfig | None) -> str:
    token = s.auth.cluster_token if s.auth is not None else ""
    channel = (
        grpc.secure_channel(s.bootstrap, channel_credentials(tls))
        if tls is not None
        else grpc.insecure_channel(s.bootstrap)
    )
    with channel:
        answer = coordinator_pb2_grpc.CoordinatorStub(channel).Metadata(
            coordinator_pb2.MetadataRequest(), metadata=tuple(bearer(token).items()), timeout=10
        )
    endpoint = answer.brokers[0].endpoint
    return f"{endpoint.host}:{endpoint.wire_port}"


# ---- 2. wrong passwords at full rate -----------------------------------------------------------


class Probe(threading.Thread):
    """The authenticated client: Metadata on the coordinator and one acked produce, every 10 ms."""

    def __init__(self, bootstrap: str, token: str, tls: TLSConfig | None) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.token, self.tls = bootstrap, token, tls
        self.metadata_ms: list[float] = []
        self.produce_ms: list[float] = []
        self.errors: dict[str, int] = {}
        self.stop = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        auth = (("authorization", f"Bearer {self.token}"),)
        channel = (
            grpc.secure_channel(self.bootstrap, channel_credentials(self.tls))
            if self.tls is not None
            else grpc.insecure_channel(self.bootstrap)
        )
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        with channel, Client(self.bootstrap, tls=self.tls, token=self.token) as client:
            producer = client.producer(TOPIC, linger=0)
            producer.send(b"warm-up").result(timeout=10)
            self.ready.set()
            while not self.stop.is_set():
                try:
                    t0 = time.perf_counter()
                    stub.Metadata(coordinator_pb2.MetadataRequest(topics=[TOPIC]), metadata=auth, timeout=10)
                    t1 = time.perf_counter()
                    producer.send(b"x" * 100).result(timeout=10)
                    t2 = time.perf_counter()
                    self.metadata_ms.append((t1 - t0) * 1000)
                    self.produce_ms.append((t2 - t1) * 1000)
                except Exception as exc:
                    self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1
                time.sleep(PROBE_INTERVAL)
            producer.close()

    def take(self) -> dict[str, Any]:
        """The figures so far, and start afresh."""
        taken = {
            "metadata": percentiles(self.metadata_ms),
            "produce_ack": percentiles(self.produce_ms),
            "errors": dict(self.errors),
        }
        self.metadata_ms, self.produce_ms, self.errors = [], [], {}
        return taken


def flood_process(
    address: str, concurrency: int, duration: float, tls: TLSConfig | None, start_at: float, out: Queue[Any]
) -> None:
    time.sleep(max(0.0, start_at - time.time()))
    credentials = channel_credentials(tls) if tls is not None else None
    out.put(asyncio.run(hammer(address, FastClient("wrong-password"), concurrency, duration, credentials)))


def flood_phase(s: Stack, opts: argparse.Namespace, tls: TLSConfig | None, session: str) -> dict[str, Any]:
    probe = Probe(s.bootstrap, session, tls)
    probe.start()
    if not probe.ready.wait(30):
        raise TimeoutError("the probe client did not start")
    probe.take()  # its first calls pay for new channels and connections
    time.sleep(opts.duration)
    before = probe.take()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 2.0  # every flood process up and imported first
    flood_args = (s.bootstrap, opts.flood_concurrency, opts.duration, tls, start_at, out)
    procs = [ctx.Process(target=flood_process, args=flood_args) for _ in range(opts.flood_processes)]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start_at - time.time()))
    probe.take()  # the probe's calls while the flood processes started
    cpu = cpu_seconds(s.coordinator.process.pid)
    t0 = time.perf_counter()
    counts: dict[str, int] = {}
    for _ in procs:
        for name, count in out.get(timeout=opts.duration + 120).items():
            counts[name] = counts.get(name, 0) + count
    elapsed = time.perf_counter() - t0
    cpu = cpu_seconds(s.coordinator.process.pid) - cpu
    during = probe.take()
    for p in procs:
        p.join()
    probe.stop.set()
    probe.join(30)
    return {
        "attempts": counts,
        "throttled": counts.get("RESOURCE_EXHAUSTED", 0),
        "unauthenticated": counts.get("UNAUTHENTICATED", 0),
        "attempts_per_s": round(sum(counts.values()) / opts.duration),
        "coordinator_cpu_share": round(cpu / elapsed, 3),
        "probe_before": before,
        "probe_during": during,
    }


# ---- main --------------------------------------------------------------------------------------


def session_token(s: Stack, tls: TLSConfig | None) -> str:
    """The bench user (created as the cluster) logged in once with SCRAM (``scram_logins.FastClient``,
    the flood's own client, over TLS too): its session token."""
    assert s.auth is not None
    with Client(s.bootstrap, tls=tls, token=s.auth.cluster_token) as admin:
        admin.admin.upsert_user(USER, PASSWORD, ITERATIONS)

    async def login() -> str:
        client = FastClient(PASSWORD)
        channel = (
            aio.secure_channel(s.bootstrap, channel_credentials(tls))
            if tls is not None
            else aio.insecure_channel(s.bootstrap)
        )
        async with channel:
            code = await client.login(auth_pb2_grpc.AuthStub(channel), USER)
        if code is not grpc.StatusCode.OK:
            raise RuntimeError(f"the bench user's login failed: {code.name}")
        return client.session_token

    return asyncio.run(login())


def tls_of(use_tls: bool) -> TLSConfig | None:
    """The stack's CA (``stack(tls=True)`` put it in ``SLUICE_TLS_CA``)."""
    return TLSConfig(ca=os.environ["SLUICE_TLS_CA"]) if use_tls else None


def with_authentication(opts: argparse.Namespace) -> dict[str, Any]:
    """New connections with each kind of token, then the flood with the default limits."""
    result: dict[str, Any] = {}
    with stack(auth=True, tls=opts.tls) as s:
        assert s.auth is not None
        tls = tls_of(opts.tls)
        with Client(s.bootstrap, tls=tls, token=s.auth.token) as client:
            client.admin.create_topic(TOPIC, partitions=1)
        session = session_token(s, tls)
        if not opts.skip_connections:
            fresh = [s.auth.sign() for _ in range(int(opts.rate * opts.duration))]
            kinds = {"session": [session], "jwt": [s.auth.token], "jwt_fresh": fresh}
            connections: dict[str, Any] = {}
            for target, address, pid in (
                ("wire", broker_wire_address(s, tls), s.broker.process.pid),
                ("grpc", s.bootstrap, s.coordinator.process.pid),
            ):
                for kind, tokens in kinds.items():
                    figures = connections_phase(target, address, pid, tokens, opts, tls)
                    connections[f"{target}_{kind}"] = figures
                    print(f"{target} {kind}: {figures}", flush=True)
            result["connections"] = connections
        if not opts.skip_flood:
            result["flood_default_limits"] = flood_phase(s, opts, tls, session)
            print(f"flood, default limits: {result['flood_default_limits']}", flush=True)
    return result


def baseline(opts: argparse.Namespace) -> dict[str, Any]:
    """The same new connections, anonymous, to a stack without authentication."""
    connections: dict[str, Any] = {}
    with stack(tls=opts.tls) as s:
        tls = tls_of(opts.tls)
        with Client(s.bootstrap, tls=tls) as client:
            client.admin.create_topic(TOPIC, partitions=1)
        for target, address, pid in (
            ("wire", broker_wire_address(s, tls), s.broker.process.pid),
            ("grpc", s.bootstrap, s.coordinator.process.pid),
        ):
            figures = connections_phase(target, address, pid, [""], opts, tls)
            connections[f"{target}_anonymous"] = figures
            print(f"{target} anonymous, no authentication: {figures}", flush=True)
    return connections


def flood_without_limits(opts: argparse.Namespace) -> dict[str, Any]:
    """The flood against a coordinator whose failed-login limits are out of the way."""
    unlimited = ("--login-failures-per-address", "1000000000", "--login-failures-per-user", "1000000000")
    with stack(auth=True, tls=opts.tls, extra_coordinator_args=unlimited) as s:
        assert s.auth is not None
        tls = tls_of(opts.tls)
        with Client(s.bootstrap, tls=tls, token=s.auth.token) as client:
            client.admin.create_topic(TOPIC, partitions=1)
        figures = flood_phase(s, opts, tls, session_token(s, tls))
    print(f"flood, limits out of the way: {figures}", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=1000.0, help="new connections per second")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per phase")
    parser.add_argument("--clients", type=int, default=2, help="processes opening connections")
    parser.add_argument("--flood-processes", type=int, default=2)
    parser.add_argument("--flood-concurrency", type=int, default=16, help="exchanges in flight per process")
    parser.add_argument("--tls", action="store_true", help="TLS on every port and connection")
    parser.add_argument("--skip-connections", action="store_true")
    parser.add_argument("--skip-flood", action="store_true")
    parser.add_argument("--skip-baseline", action="store_true")
    opts = parser.parse_args()
    result: dict[str, Any] = {"rate": opts.rate, "duration_s": opts.duration, "tls": opts.tls}
    result.update(with_authentication(opts))
    if not opts.skip_connections and not opts.skip_baseline:
        result["connections"].update(baseline(opts))
    if not opts.skip_flood:
        result["flood_no_limits"] = flood_without_limits(opts)
    save(f"auth_cost{'_tls' if opts.tls else ''}", result)


if __name__ == "__main__":
    main()
