"""SCRAM login capacity and the coordinator's responsiveness while wrong passwords arrive at full rate.

Real processes: a private Redis and two coordinators, one with the default failed-login limits and one
with the limits out of the way. The clients are grpc.aio streams in this process that compute the
client's PBKDF2 once per user and cache it, so the figures are the coordinator's cost, not the client's
(an SDK login runs PBKDF2 each time: ~5 ms at the default 16384 iterations, on the client).

1. ``logins``: correct logins, ``--concurrency`` at a time, for ``--duration`` s: logins/s and the
   coordinator's CPU per login;
2. ``probe`` alone: ListTopics latency (p50/p99) on an idle coordinator, one call every 10 ms;
3. ``flood_limited``: wrong passwords at full rate from one address against the default limits
   (refused with THROTTLED after 20), with the probe running: attempts/s, probe latency, coordinator CPU;
4. ``flood_unlimited``: the same with the limiter out of the way (every attempt a full SCRAM exchange
   ending UNAUTHENTICATED).

Usage: ``python bench/scram_logins.py [--duration 5] [--concurrency 16]``
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import secrets
import statistics
import time
from dataclasses import dataclass

import grpc
from grpc import aio

from _stack import cpu_seconds, save
from sluice import Client
from sluice.v1 import auth_pb2 as pb
from sluice.v1 import auth_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc

USER, PASSWORD, ITERATIONS = "bench", "bench-password", 4096


@dataclass
class Keys:
    client_key: bytes
    stored_key: bytes


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


class FastClient:
    """A SCRAM-SHA-256 client that caches the salted password per salt (the bench measures the server)."""

    def __init__(self, password: str) -> None:
        self._password = password.encode()
        self._keys: dict[tuple[bytes, int], Keys] = {}
        #: The session token of the last successful login.
        self.session_token = ""

    def keys(self, salt: bytes, iterations: int) -> Keys:
        found = self._keys.get((salt, iterations))
        if found is None:
            salted = hashlib.pbkdf2_hmac("sha256", self._password, salt, iterations)
            client_key = _hmac(salted, b"Client Key")
            found = self._keys[(salt, iterations)] = Keys(client_key, hashlib.sha256(client_key).digest())
        return found

    async def login(self, stub: auth_pb2_grpc.AuthAsyncStub, user: str) -> grpc.StatusCode:
        bare = f"n={user},r={secrets.token_hex(12)}"
        call = stub.Authenticate()  # type: ignore[call-arg]  # grpc.aio: the stream is written to
        try:
            await call.write(pb.AuthMessage(mechanism="SCRAM-SHA-256", scram=f"n,,{bare}".encode()))
            first = await call.read()
            if not isinstance(first, pb.AuthMessage):  # the stream ended
                return await call.code()
            server_first = first.scram.decode()
            attrs = dict(p.split("=", 1) for p in server_first.split(","))
            keys = self.keys(base64.b64decode(attrs["s"]), int(attrs["i"]))
            without_proof = f"c=biws,r={attrs['r']}"
            signature = _hmac(keys.stored_key, f"{bare},{server_first},{without_proof}".encode())
            proof = bytes(a ^ b for a, b in zip(keys.client_key, signature, strict=True))
            await call.write(
                pb.AuthMessage(scram=f"{without_proof},p={base64.b64encode(proof).decode()}".encode())
            )
            final = await call.read()
            if isinstance(final, pb.AuthMessage) and final.session_token:
                self.session_token = final.session_token
                return grpc.StatusCode.OK
            return await call.code()
        except aio.AioRpcError as exc:
            return exc.code()
        finally:
            call.cancel()


async def hammer(
    address: str,
    client: FastClient,
    concurrency: int,
    duration: float,
    credentials: grpc.ChannelCredentials | None = None,
) -> dict[str, int]:
    """``concurrency`` exchanges at once for ``duration`` s (TLS with ``credentials``): the codes."""
    counts: dict[str, int] = {}
    channel = (
        aio.secure_channel(address, credentials) if credentials is not None else aio.insecure_channel(address)
    )
    async with channel:
        stub: auth_pb2_grpc.AuthAsyncStub = auth_pb2_grpc.AuthStub(channel)
        end = time.monotonic() + duration

        async def worker() -> None:
            while time.monotonic() < end:
                code = await client.login(stub, USER)
                counts[code.name] = counts.get(code.name, 0) + 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return counts


async def probe(address: str, duration: float) -> dict[str, float]:
    latencies: list[float] = []
    async with aio.insecure_channel(address) as channel:
        stub: coordinator_pb2_grpc.CoordinatorAsyncStub = coordinator_pb2_grpc.CoordinatorStub(channel)
        end = time.monotonic() + duration
        while time.monotonic() < end:
            started = time.perf_counter()
            await stub.ListTopics(coordinator_pb2.ListTopicsRequest(), timeout=10)
            latencies.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(0.01)
    latencies.sort()
    return {
        "calls": len(latencies),
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1], 2),
        "max_ms": round(latencies[-1], 2),
    }


async def flood_with_probe(
    address: str, concurrency: int, duration: float
) -> tuple[dict[str, int], dict[str, float]]:
    counts, latency = await asyncio.gather(
        hammer(address, FastClient("wrong-password"), concurrency, duration), probe(address, duration)
    )
    return counts, latency


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    # After _stack put the repository root on sys.path.
    from tests.harness import free_port, run_redis, start_service

    result: dict[str, object] = {"duration_s": args.duration, "concurrency": args.concurrency}
    with run_redis() as redis:
        base = ["--redis-url", redis.url, "--metrics-port", "0", "--log-level", "WARNING"]
        limited = start_service("coordinator", *base, "--port", str(free_port()))
        unlimited = start_service(
            "coordinator",
            *base,
            "--port",
            str(free_port()),
            "--login-failures-per-address",
            "1000000000",
            "--login-failures-per-user",
            "1000000000",
        )
        try:
            with Client(limited.address) as admin:
                admin.admin.upsert_user(USER, PASSWORD, ITERATIONS)

            cpu = cpu_seconds(unlimited.process.pid)
            counts = asyncio.run(
                hammer(unlimited.address, FastClient(PASSWORD), args.concurrency, args.duration)
            )
            cpu = cpu_seconds(unlimited.process.pid) - cpu
            ok = counts.get("OK", 0)
            result["logins"] = {
                "counts": counts,
                "per_second": round(ok / args.duration),
                "coordinator_cpu_ms_per_login": round(cpu * 1000 / max(ok, 1), 3),
            }
            result["probe_idle"] = asyncio.run(probe(limited.address, args.duration))
            for name, process in (("flood_limited", limited), ("flood_unlimited", unlimited)):
                cpu = cpu_seconds(process.process.pid)
                counts, latency = asyncio.run(
                    flood_with_probe(process.address, args.concurrency, args.duration)
                )
                cpu = cpu_seconds(process.process.pid) - cpu
                total = sum(counts.values())
                result[name] = {
                    "counts": counts,
                    "attempts_per_second": round(total / args.duration),
                    "coordinator_cpu_share": round(cpu / args.duration, 2),
                    "probe": latency,
                }
        finally:
            limited.terminate()
            unlimited.terminate()
    save("scram_logins", result)


if __name__ == "__main__":
    main()
