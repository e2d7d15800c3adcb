"""Where ``sluice up`` puts every service's ports: the coordinator on ``--port``, the others at fixed
offsets from it (whatever the start order), metrics ports in the same order from ``--metrics-port``,
and a check that no metrics port lands on a gRPC or wire port.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.cli.errors import CliError

__all__ = [
    "DEFAULT_PORT",
    "MAX_BROKERS",
    "METRICS_OFFSET",
    "PORT_OFFSETS",
    "Ports",
    "broker_ports",
    "check_port_collisions",
    "plan_ports",
]

DEFAULT_PORT = 7600
METRICS_OFFSET = 2000
# Port offsets from --port / --metrics-port, fixed per service whatever the start order.
PORT_OFFSETS = {"coordinator": 0, "broker": 1, "offset-store": 2, "dispatcher": 3}
#: Local brokers beyond this are a mistake on a development machine (each is a process and its fsyncs);
#: and broker 8's gRPC port (--port + 11) would be broker 0's wire port (its gRPC port + 10).
MAX_BROKERS = 7


@dataclass(frozen=True)
class Ports:
    port: int
    metrics: int


def plan_ports(base: int, metrics_base: int | None) -> dict[str, Ports]:
    """Every service's (port, metrics port); base 0 means ephemeral everywhere."""
    if metrics_base is None:
        metrics_base = base + METRICS_OFFSET if base else 0
    if base and base + max(PORT_OFFSETS.values()) + MAX_BROKERS > 65535:
        raise CliError("INVALID_ARGUMENT", f"--port {base} leaves no room for the services after it")
    return {
        name: Ports(base + off if base else 0, metrics_base + off if metrics_base else 0)
        for name, off in PORT_OFFSETS.items()
    }


def check_port_collisions(plan: dict[str, Ports], brokers: int) -> None:
    """Refuse a plan in which a metrics port lands on a gRPC or wire port (``--metrics-port 7610``
    would take broker 0's wire port and fail its start with a bind error, far from the cause)."""
    # Here, not at the top: sluice.common.wire loads gRPC, which `sluice --help` does not need.
    from sluice.common.wire import WIRE_PORT_OFFSET

    listeners = [*plan.values(), *(broker_ports(plan, i) for i in range(1, brokers))]
    grpc = {p.port for p in listeners if p.port}
    wire = {port + WIRE_PORT_OFFSET for port in grpc}
    metrics = {p.metrics for p in listeners if p.metrics}
    clash = sorted(metrics & (grpc | wire))
    if clash:
        raise CliError(
            "INVALID_ARGUMENT",
            f"metrics port {clash[0]} is also a gRPC or wire port of this cluster (gRPC ports "
            f"{min(grpc)}-{max(grpc)}, wire ports {min(wire)}-{max(wire)}): choose --metrics-port "
            "outside them",
        )


def broker_ports(plan: dict[str, Ports], index: int) -> Ports:
    """Broker ``index``'s ports: broker 0 has the ``broker`` slot; the others follow the dispatcher's
    (``+4``, ``+5``, ...), so adding brokers moves no other service's port."""
    if index == 0:
        return plan["broker"]
    base = plan["broker"]
    offset = max(PORT_OFFSETS.values()) - PORT_OFFSETS["broker"] + index
    return Ports(base.port + offset if base.port else 0, base.metrics + offset if base.metrics else 0)
