"""Start a coordinator + broker (+ private Redis) for a benchmark, as real processes.

``stack(push=True)`` also starts the offset store and a dispatcher (push subscriptions).
``stack(tls=True)`` serves TLS on every port (a private CA in the stack's directory) and sets
``SLUICE_TLS_CA`` in this process's environment, so every SDK client of the benchmark (and the
processes it spawns) connects over TLS with no change of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "services"))
sys.path.insert(0, str(ROOT))

from tests.harness import ServiceProcess, free_port, run_redis, start_service  # noqa: E402

from sluice.security import certs  # noqa: E402

RESULTS = ROOT / "bench" / "results"


@dataclass
class Stack:
    bootstrap: str
    broker: ServiceProcess
    coordinator: ServiceProcess
    data_dir: Path
    extra: tuple[ServiceProcess, ...] = ()


@contextlib.contextmanager
def stack(
    flush: str = "interval",
    extra_broker_args: tuple[str, ...] = (),
    push: bool = False,
    redis_fsync: str = "off",
    tls: bool = False,
) -> Iterator[Stack]:
    """The services on loopback over a private Redis; ``redis_fsync``: ``off`` (no AOF), or the
    ``appendfsync`` policy to run its AOF with (``always``, as `sluice up` does, or ``everysec``)."""
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
                *tls_args("coordinator"),
            )
        )
        broker = started(
            start_service(
                "broker", "--port", "0", "--metrics-port", "0", "--broker-id", "0",
                "--data-dir", str(Path(d) / "broker"), "--coordinator", coord.address,
                "--flush", flush, *extra_broker_args, *tls_args("broker"),
            )
        )  # fmt: skip
        extra: list[ServiceProcess] = []
        if push:
            extra.append(
                started(
                    start_service(
                        "offset-store", "--port", str(store_port), "--metrics-port", "0",
                        "--redis-url", redis.url, "--coordinator", coord.address, *tls_args("offset-store"),
                    )
                )
            )  # fmt: skip
            extra.append(
                started(
                    start_service(
                        "dispatcher", "--port", "0", "--metrics-port", "0", "--coordinator", coord.address,
                        "--dispatcher-id", "bench", *tls_args("dispatcher"),
                    )
                )
            )  # fmt: skip
        yield Stack(coord.address, broker, coord, Path(d), tuple(extra))


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
