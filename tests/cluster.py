"""A whole Sluice cluster as real processes: coordinator, broker, offset store and one dispatcher over a
given Redis, on loopback with free ports. The one way the integration tests start all four services;
each suite adds its own flags (TLS, authentication) per service and its own extras on top."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.harness import RedisServer, ServiceProcess, free_port, start_service

#: The dispatcher's id (a push test restarting it keeps the id).
DISPATCHER_ID = "d1"


@dataclass
class Services:
    coordinator: ServiceProcess
    broker: ServiceProcess
    offset_store: ServiceProcess
    dispatcher: ServiceProcess

    @property
    def all(self) -> list[ServiceProcess]:
        return [self.coordinator, self.broker, self.offset_store, self.dispatcher]


def no_flags(_service: str) -> Sequence[str]:
    return ()


@contextlib.contextmanager
def run_services(
    redis: RedisServer,
    data_dir: Path,
    flags: Callable[[str], Sequence[str]] = no_flags,
    dispatcher_args: Sequence[str] = (),
) -> Iterator[Services]:
    """Start the four services (``flags(service)`` added to each one's command line); stop them all
    (reverse order) when the block ends, however it ends."""
    started: list[ServiceProcess] = []
    try:
        os_port = free_port()
        coordinator = start_service(
            "coordinator",
            *("--port", "0", "--metrics-port", "0", "--redis-url", redis.url),
            *("--offset-store", f"127.0.0.1:{os_port}", *flags("coordinator")),
        )
        started.append(coordinator)
        broker = start_service(
            "broker",
            *("--port", "0", "--metrics-port", "0", "--data-dir", str(data_dir / "broker")),
            *("--broker-id", "1", "--coordinator", coordinator.address, *flags("broker")),
        )
        started.append(broker)
        store = start_service(
            "offset-store",
            *("--port", str(os_port), "--metrics-port", "0", "--redis-url", redis.url),
            *("--coordinator", coordinator.address, *flags("offset-store")),
        )
        started.append(store)
        dispatcher = start_service(
            "dispatcher",
            *("--port", "0", "--metrics-port", "0", "--coordinator", coordinator.address),
            *("--dispatcher-id", DISPATCHER_ID, "--cursor-flush-interval", "50ms"),
            *dispatcher_args,
            *flags("dispatcher"),
        )
        started.append(dispatcher)
        yield Services(coordinator, broker, store, dispatcher)
    finally:
        for sp in reversed(started):
            sp.terminate()
