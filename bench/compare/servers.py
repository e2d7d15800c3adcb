"""The servers of every system, started here as this harness's own processes on loopback ports of
27000-27999, stopped by PID, with the version each one reports.

Never the machine's own services: every server gets its own port (checked free), its own data
directory in a temporary directory, and for RabbitMQ its own node name, Erlang cookie (a private
HOME) and its own epmd on a port of the range.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PORT_RANGE = (27000, 27999)
ROOT = Path(__file__).resolve().parents[2]
#: The tree whose Sluice services run (default: this one). ``bench/push_compare_ab.py`` points it at an
#: older checkout (with that tree's ``services`` on the clients' PYTHONPATH too), so both trees run
#: under the same harness and adapters.
SLUICE_TREE = Path(os.environ.get("COMPARE_SLUICE_TREE") or ROOT)


class ServerError(RuntimeError):
    """A server did not start (its log's tail is in the message)."""


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Ports:
    """Blocks of consecutive free ports from PORT_RANGE, never handing out one twice."""

    def __init__(self) -> None:
        self.cursor = PORT_RANGE[0]

    def block(self, count: int) -> int:
        base = self.cursor
        while base + count - 1 <= PORT_RANGE[1]:
            busy = [p for p in range(base, base + count) if not _port_free(p)]
            if not busy:
                self.cursor = base + count
                return base
            base = busy[-1] + 1
        raise ServerError(f"no {count} consecutive free ports left in {PORT_RANGE}")


def descendants(root: int) -> list[int]:
    """``root`` and every process under it (from /proc), so a server's helpers count too."""
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = Path(stat).read_text()
            ppid = int(text.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.split("/")[2]))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


@dataclass
class Server:
    """One running server: the processes it owns (roots; their descendants are found when sampled)."""

    name: str
    version: str
    endpoint: dict[str, str]
    procs: list[subprocess.Popen[bytes]]
    #: Root PIDs not started as Popen here (a daemon's beam.smp, found by its pid file).
    extra_roots: list[int] = field(default_factory=list)
    #: Helpers that ignore SIGTERM (RabbitMQ's epmd): SIGKILLed once the server itself is down.
    helpers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    stop_grace: float = 15.0

    def pids(self) -> list[int]:
        live = [p.pid for p in (*self.procs, *self.helpers) if p.poll() is None]
        roots = live + [pid for pid in self.extra_roots if _alive(pid)]
        found = {pid for root in roots for pid in descendants(root)}
        return sorted(found)

    def stop(self) -> None:
        """SIGTERM to every root, the grace period, then SIGKILL to whatever of them is left."""
        pids = self.pids()
        for pid in [*self.extra_roots, *(p.pid for p in reversed(self.procs))]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace
        for proc in reversed(self.procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        helpers = {p.pid for p in self.helpers}
        for pid in pids:
            while pid not in helpers and _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError):
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
        for proc in [*self.procs, *self.helpers]:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"exited with {proc.returncode}: {_tail(log)}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise ServerError(f"port {port} not open after {timeout} s: {_tail(log)}")


def _tail(log: Path) -> str:
    with contextlib.suppress(OSError):
        return log.read_text(errors="replace")[-2000:]
    return "(no log)"


def _version(argv: list[str], pattern: str) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    found = re.search(pattern, out.stdout + out.stderr)
    return found.group(1) if found else "unknown"


def _binary(name: str, *candidates: str) -> str:
    for path in (*candidates, shutil.which(name) or ""):
        if path and os.access(path, os.X_OK):
            return path
    raise ServerError(f"{name} not found: `make compare` installs it through scripts/install-tools.sh")


def start_redis(ports: Ports, workdir: Path, name: str, appendfsync: str = "") -> Server:
    """redis-server without persistence (``appendfsync`` "") or with its AOF at that fsync policy."""
    exe = _binary("redis-server")
    port = ports.block(1)
    data = workdir / name
    data.mkdir()
    aof = ["--appendonly", "yes", "--appendfsync", appendfsync] if appendfsync else ["--appendonly", "no"]
    argv = [
        exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data), "--save", "", *aof,
        "--maxmemory-policy", "noeviction", "--daemonize", "no", "--logfile", str(data / "redis.log"),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_port(port, proc, data / "redis.log", 20)
    version = _version([exe, "--version"], r"v=(\S+)")
    return Server(name, f"Redis {version}", {"url": f"redis://127.0.0.1:{port}/0"}, [proc])


def start_nats(ports: Ports, workdir: Path) -> Server:
    """nats-server with JetStream, its file store in the work directory."""
    exe = _binary("nats-server", "/usr/sbin/nats-server")
    port = ports.block(1)
    data = workdir / "nats"
    data.mkdir()
    log = data / "nats.log"
    argv = [exe, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(data / "store"), "-l", str(log)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_port(port, proc, log, 20)
    version = _version([exe, "--version"], r"v(\d\S*)")
    return Server("nats", f"NATS server {version}", {"url": f"nats://127.0.0.1:{port}"}, [proc])


def start_rabbitmq(ports: Ports, workdir: Path) -> Server:
    """A RabbitMQ node of its own: node name, ports (AMQP, distribution, epmd), Mnesia and log
    directories, enabled-plugins file and Erlang cookie (in a private HOME) all in the work directory."""
    exe = _binary("rabbitmq-server", "/usr/lib/rabbitmq/bin/rabbitmq-server")
    epmd_exe = _binary("epmd")
    base = ports.block(3)
    epmd_port, amqp, dist = base, base + 1, base + 2
    home = workdir / "rabbitmq"
    home.mkdir()
    cookie = home / ".erlang.cookie"
    cookie.write_text(os.urandom(16).hex())
    cookie.chmod(0o400)
    (home / "rabbitmq.conf").write_text(f"listeners.tcp.default = 127.0.0.1:{amqp}\n")
    (home / "enabled_plugins").write_text("[].\n")
    env = dict(os.environ)
    env.update(
        HOME=str(home), ERL_EPMD_PORT=str(epmd_port), ERL_EPMD_ADDRESS="127.0.0.1",
        RABBITMQ_NODENAME=f"sluice-compare-{amqp}@localhost", RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
        RABBITMQ_NODE_PORT=str(amqp), RABBITMQ_DIST_PORT=str(dist),
        RABBITMQ_MNESIA_BASE=str(home / "mnesia"), RABBITMQ_LOG_BASE=str(home / "log"),
        RABBITMQ_ENABLED_PLUGINS_FILE=str(home / "enabled_plugins"),
        RABBITMQ_CONFIG_FILE=str(home / "rabbitmq.conf"), RABBITMQ_PID_FILE=str(home / "rabbitmq.pid"),
    )  # fmt: skip
    log = home / "server.log"
    # Our own epmd in the foreground (no -daemon): then its PID is ours to stop.
    epmd = subprocess.Popen([epmd_exe, "-port", str(epmd_port)], env=env, stdout=subprocess.DEVNULL)
    with log.open("wb") as out:
        proc = subprocess.Popen([exe], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=home)
    server = Server("rabbitmq", "RabbitMQ", {"url": f"amqp://guest:guest@127.0.0.1:{amqp}/"}, [proc])
    server.helpers.append(epmd)
    try:
        _wait_port(amqp, proc, log, 120)
        # The node's own process (beam.smp), which SIGTERM stops cleanly; the script may not pass it on.
        server.extra_roots.append(int((home / "rabbitmq.pid").read_text().split()[0]))
    except (ServerError, OSError, ValueError):
        server.stop()
        raise
    banner = _tail(log)
    rabbit = re.search(r"RabbitMQ (\d+\.\d+\.\d+)", banner)
    erlang = re.search(r"Erlang:\s+(\S+)", banner)
    server.version = (
        f"RabbitMQ {rabbit.group(1) if rabbit else '?'} (Erlang {erlang.group(1) if erlang else '?'})"
    )
    return server


def start_sluice(ports: Ports, workdir: Path, name: str, flush: str, brokers: int = 1) -> Server:
    """``sluice up`` with its own Redis (AOF fsync always, as `sluice up` runs its private one), every
    port in the range: coordinator at base, the others after it, wire ports +10, metrics from +30."""
    redis = start_redis(ports, workdir, f"{name}-redis", appendfsync="always")
    base = ports.block(40)
    data = workdir / name
    argv = [
        sys.executable, "-m", "sluice", "up", "--data-dir", str(data), "--redis-url", redis.endpoint["url"],
        "--port", str(base), "--metrics-port", str(base + 30), "--flush", flush, "--brokers", str(brokers),
        "--grace", "10",
    ]  # fmt: skip
    # A diagnosis knob, not a configuration of the table: "separate" runs a process per service, so a
    # sampler can tell which service holds the memory (docs/memory.md, "Producer batch size").
    if os.environ.get("COMPARE_SLUICE_PROCESSES"):
        argv += ["--processes", os.environ["COMPARE_SLUICE_PROCESSES"]]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(SLUICE_TREE / "services"), env.get("PYTHONPATH"))))
    up = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert up.stdout is not None
        for raw in up.stdout:
            lines.append(raw.decode(errors="replace"))
            if lines[-1].startswith("Sluice is up"):
                ready.set()

    threading.Thread(target=read, daemon=True, name=f"{name}-out").start()
    server = Server(
        name, f"Sluice {_sluice_version()}", {"bootstrap": f"127.0.0.1:{base}"}, [*redis.procs, up]
    )
    deadline = time.monotonic() + 120
    while not ready.wait(0.2):
        if up.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise ServerError(f"sluice up did not start: {''.join(lines)[-2000:]}")
    server.endpoint["brokers"] = str(brokers)
    return server


def _sluice_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("sluice")
    except PackageNotFoundError:
        release = "?"
    commit = subprocess.run(
        ["git", "-C", str(SLUICE_TREE), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return f"{release} ({commit or 'no git'})"


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    try:
        yield server
    finally:
        server.stop()


def workdir() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="sluice-compare-")
