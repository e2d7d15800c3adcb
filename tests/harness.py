"""Real processes on loopback: a private redis-server and Sluice services.

Every integration test talks to real components. ``run_redis()`` starts a
private ``redis-server`` on a free port in a temp dir; ``run_service()`` starts
``python -m sluice <service> ...`` with port 0 and waits for its
``SLUICE_READY`` line, which carries the real ports. A missing redis-server
fails loudly; nothing is skipped silently.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ROOT / "services"
READY = re.compile(r"SLUICE_READY service=(\S+) address=(\S+) metrics=(\S+)")


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A free port for a service that must be told its port before it starts (the offset store and
    the coordinator name each other).

    Chosen below the kernel's ephemeral range: a port the kernel handed out with ``bind(0)`` is free
    only until the kernel hands it out again, to any outgoing connection of any process, and a
    service started a moment later then fails with EADDRINUSE (seen in CI). Ports below the range are
    taken only by explicit binds, and the random choice makes two tests picking the same one unlikely.
    """
    low, _ = _ephemeral_range()
    for _ in range(100):
        # Below low - 20: a broker told its port serves its wire port at port + 10, also below the range.
        port = random.randrange(max(1024, low - 12_000), low - 20)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SERVICES) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class RedisServer:
    port: int
    dir: Path
    process: subprocess.Popen[bytes]
    appendonly: bool
    appendfsync: str = "always"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def kill(self) -> None:
        """kill -9, as a crash would."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    extra: tuple[str, ...] = ()

    def restart(self) -> None:
        self.process = _start_redis(self.port, self.dir, self.appendonly, self.appendfsync, self.extra)


def _start_redis(
    port: int,
    directory: Path,
    appendonly: bool,
    appendfsync: str = "always",
    extra: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not on PATH: install it (make deps does) to run the tests")
    args = [
        exe,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(directory),
        "--save",
        "",
        "--appendonly",
        "yes" if appendonly else "no",
        "--appendfsync",
        appendfsync,
        # As `sluice up` and the chart run it: every service refuses a Redis that may evict keys.
        "--maxmemory-policy",
        "noeviction",
        "--daemonize",
        "no",
        "--logfile",
        str(directory / "redis.log"),
        *extra,
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited: {(directory / 'redis.log').read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2) as s:
            s.sendall(b"PING\r\n")
            if s.recv(16).startswith(b"+PONG"):
                return proc
        time.sleep(0.02)
    proc.kill()
    raise RuntimeError("redis-server did not become ready")


@contextlib.contextmanager
def run_redis(
    appendonly: bool = True, appendfsync: str = "always", extra: tuple[str, ...] = ()
) -> Iterator[RedisServer]:
    """A private redis-server; ``appendfsync`` as `sluice up` runs it (docs/offset-store.md); ``extra``:
    more redis-server flags (they come last, so they override the defaults above)."""
    with tempfile.TemporaryDirectory(prefix="sluice-redis-") as d:
        port = free_port()
        proc = _start_redis(port, Path(d), appendonly, appendfsync, extra)
        server = RedisServer(port, Path(d), proc, appendonly, appendfsync, extra)
        try:
            yield server
        finally:
            if server.process.poll() is None:
                server.process.terminate()
                try:
                    server.process.wait(10)
                except subprocess.TimeoutExpired:
                    server.process.kill()


@dataclass
class SentinelSet:
    """A Redis primary, one replica and one Sentinel watching them, all private (``run_redis_sentinel``)."""

    primary: RedisServer
    replica: RedisServer
    sentinel_port: int
    sentinel: subprocess.Popen[bytes]
    service_name: str = "sluice"

    @property
    def url(self) -> str:
        """The address a Sluice service follows the primary by (common/redis_client.py)."""
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{self.service_name}/0"

    def primary_port(self) -> int:
        """Where the Sentinel says the primary is now."""
        import redis  # here, not at the top: see _wait_for_replica

        with redis.Redis(port=self.sentinel_port, socket_timeout=2) as s:
            _host, port = s.sentinel_get_master_addr_by_name(self.service_name)
        return int(port)


def _wait_for_replica(sentinel_port: int, service_name: str, timeout: float = 20) -> None:
    """Until the Sentinel knows the replica: it can only fail over to a replica it has discovered."""
    # redis-py is imported only where a Sentinel is asked: every bench's client processes import this
    # module (through bench/_stack.py), and redis-py's modules would add their import time and their
    # objects (walked by every full GC collection) to the client CPU the benches measure.
    import redis

    deadline = time.monotonic() + timeout
    with redis.Redis(port=sentinel_port, socket_timeout=2) as s:
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                replicas = s.sentinel_slaves(service_name)
                if replicas and not any(r.get("is_sdown") or r.get("is_disconnected") for r in replicas):
                    return
            time.sleep(0.1)
    raise RuntimeError("the Sentinel did not discover the replica")


@contextlib.contextmanager
def run_redis_sentinel(down_after_ms: int = 500) -> Iterator[SentinelSet]:
    """A primary with a replica and a Sentinel (quorum 1) that fails over ``down_after_ms`` after the
    primary stops answering; every process on loopback, in private directories."""
    with tempfile.TemporaryDirectory(prefix="sluice-sentinel-") as d:
        root = Path(d)
        dirs = [root / name for name in ("primary", "replica", "sentinel")]
        for directory in dirs:
            directory.mkdir()
        primary_port, replica_port, sentinel_port = free_port(), free_port(), free_port()
        primary = RedisServer(primary_port, dirs[0], _start_redis(primary_port, dirs[0], True), True)
        replica_extra = ("--replicaof", "127.0.0.1", str(primary_port))
        replica = RedisServer(
            replica_port,
            dirs[1],
            _start_redis(replica_port, dirs[1], True, extra=replica_extra),
            True,
            extra=replica_extra,
        )
        conf = dirs[2] / "sentinel.conf"
        conf.write_text(
            f"port {sentinel_port}\nbind 127.0.0.1\ndir {dirs[2]}\nlogfile {dirs[2] / 'sentinel.log'}\n"
            f"sentinel monitor sluice 127.0.0.1 {primary_port} 1\n"
            f"sentinel down-after-milliseconds sluice {down_after_ms}\n"
            "sentinel failover-timeout sluice 3000\nsentinel parallel-syncs sluice 1\n"
        )
        exe = shutil.which("redis-server")
        assert exe is not None
        sentinel = subprocess.Popen(
            [exe, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        processes = [primary, replica]
        try:
            _wait_for_replica(sentinel_port, "sluice")
            yield SentinelSet(primary, replica, sentinel_port, sentinel)
        finally:
            sentinel.terminate()
            sentinel.wait(10)
            for server in processes:
                if server.process.poll() is None:
                    server.process.terminate()
                    try:
                        server.process.wait(10)
                    except subprocess.TimeoutExpired:
                        server.process.kill()


@dataclass
class ServiceProcess:
    """A running ``sluice <service>`` process and what its ready line said."""

    service: str
    args: list[str]
    process: subprocess.Popen[str]
    address: str
    metrics: str
    output: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def kill(self) -> None:
        """kill -9: no flush, no goodbye."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def terminate(self, timeout: float = 15) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode

    def log(self) -> str:
        return "".join(self.output)


def start_service(
    service: str,
    *args: str,
    timeout: float = 30,
    nofile: tuple[int, int] | None = None,
    wrap: Sequence[str] = (),
) -> ServiceProcess:
    """Start ``python -m sluice <service> --port 0 ...`` and wait until it is ready.

    ``nofile``: the (soft, hard) open-files limit the process starts with. ``wrap``: a module (and its
    arguments) that runs ``sluice`` for it: ``python -m <wrap...> sluice <service> ...`` (the power-loss
    seam, ``tests/chaos/fsync_ledger.py``).
    """
    cmd = [sys.executable, "-m", *wrap, "sluice", service, *args]
    if nofile is not None:  # prlimit(1) sets it in the child only, with no preexec_fn in a threaded parent
        cmd = ["prlimit", f"--nofile={nofile[0]}:{nofile[1]}", "--", *cmd]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=ROOT
    )
    output: list[str] = []
    ready: list[re.Match[str]] = []
    got = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        with proc.stdout:  # closed at EOF, so no ResourceWarning once the process is gone
            for line in proc.stdout:
                output.append(line)
                m = READY.search(line)
                if m and not ready:
                    ready.append(m)
                    got.set()
        got.set()

    threading.Thread(target=pump, daemon=True, name=f"pump-{service}").start()
    if not got.wait(timeout) or not ready:
        proc.kill()
        proc.wait(10)  # reaped: an unreaped child surfaces as a ResourceWarning in some later test
        raise RuntimeError(f"{service} did not become ready:\n{''.join(output)[-4000:]}")
    m = ready[0]
    return ServiceProcess(service, list(args), proc, m.group(2), m.group(3), output)


@contextlib.contextmanager
def run_service(service: str, *args: str, timeout: float = 30) -> Iterator[ServiceProcess]:
    sp = start_service(service, *args, timeout=timeout)
    try:
        yield sp
    finally:
        sp.terminate()


def restart(sp: ServiceProcess, timeout: float = 30) -> ServiceProcess:
    """Start the same service again with the same arguments (after kill or terminate)."""
    return start_service(sp.service, *sp.args, timeout=timeout)
