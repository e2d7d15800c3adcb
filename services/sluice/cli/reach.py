"""Say at once what is wrong with ``--bootstrap``, instead of a timeout 30 s later.

Two mistakes a new user makes in the first minutes (issue 18): a wrong address, or the right host
with another service's port. The SDK cannot tell either from a restarting coordinator, so it retries
for the whole request timeout and then says ``REQUEST_TIMED_OUT`` or ``UNIMPLEMENTED: Method not
found!``. The command line can: it knows a person is waiting.

- ``preflight``: one TCP connect per bootstrap address before the command runs. Refused or
  unresolvable everywhere: fail now, naming the address and what to check. No answer yet: say on
  stderr that it is connecting, and to what, then let the SDK wait as usual.
- ``identify_port``: after an ``UNIMPLEMENTED`` answer, ask the address which Sluice service it is (a
  read-only call of each service's API with an empty request: any answer but UNIMPLEMENTED names it).
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from typing import Any, TextIO

import grpc
from google.protobuf.message import Message

from sluice import DEFAULT_BOOTSTRAP
from sluice.cli.errors import CliError
from sluice.common.peers import Peers
from sluice.common.rpc import answered_error, is_unimplemented
from sluice.v1 import (
    broker_pb2,
    broker_pb2_grpc,
    coordinator_pb2,
    coordinator_pb2_grpc,
    dispatcher_pb2,
    dispatcher_pb2_grpc,
    offset_store_pb2,
    offset_store_pb2_grpc,
)

#: How long the TCP probe waits before saying "connecting ..." (a live coordinator answers in well
#: under a millisecond on a LAN; a firewall that drops packets never answers).
PROBE_SECONDS = 2.0

#: One read-only call per service: an empty request changes nothing on any of them.
SERVICE_PROBES: dict[str, tuple[type[Any], str, Callable[[], Message]]] = {
    "a broker": (broker_pb2_grpc.BrokerStub, "OffsetForLeaderEpoch", broker_pb2.OffsetForLeaderEpochRequest),
    "a dispatcher": (
        dispatcher_pb2_grpc.DispatcherStub,
        "ListSubscriptions",
        dispatcher_pb2.ListSubscriptionsRequest,
    ),
    "an offset store": (
        offset_store_pb2_grpc.OffsetStoreStub,
        "FetchOffsets",
        offset_store_pb2.FetchOffsetsRequest,
    ),
    "the coordinator": (
        coordinator_pb2_grpc.CoordinatorStub,
        "ListTopics",
        coordinator_pb2.ListTopicsRequest,
    ),
}

HINT = (
    "--bootstrap (or SLUICE_BOOTSTRAP) takes the coordinator's address, host:port; "
    f"`sluice up` prints it (default {DEFAULT_BOOTSTRAP})"
)


def _split(address: str) -> tuple[str, int] | None:
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def _probe(address: str) -> str | None:
    """None if a TCP connection to ``address`` opens; else why not, in words."""
    parts = _split(address)
    if parts is None:
        return "not a host:port address"
    try:
        with socket.create_connection(parts, timeout=PROBE_SECONDS):
            return None
    except ConnectionRefusedError:
        return "connection refused (nothing listens on that port)"
    except socket.gaierror as exc:
        return f"cannot resolve the host ({exc.strerror})"
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return exc.strerror or str(exc)


def preflight(bootstrap: str, request_timeout: float, err: TextIO = sys.stderr) -> None:
    """Fail fast when no bootstrap address accepts a connection; CliError says which and why."""
    addresses = [a for a in bootstrap.split(",") if a.strip()]
    reasons = {address: _probe(address) for address in addresses}
    if any(reason is None for reason in reasons.values()):
        return
    if all(reason == "timeout" for reason in reasons.values()):
        print(
            f"connecting to the coordinator at {bootstrap} (no answer within {PROBE_SECONDS:g} s; "
            f"waiting up to {request_timeout:g} s, --request-timeout) ...",
            file=err,
        )
        return
    failed = "; ".join(f"{address}: {reason}" for address, reason in reasons.items())
    raise CliError(
        "BROKER_NOT_AVAILABLE",
        f"cannot reach the coordinator at {failed}. Is the cluster running? {HINT}",
    )


def identify_port(address: str, timeout: float = 2.0) -> str | None:
    """Which Sluice service answers at ``address`` (plaintext), e.g. "a broker"; None if none does."""
    peers = Peers()  # plaintext: the probe is a hint, and a TLS port would not answer it anyway
    try:
        for name, (stub_class, method, request) in SERVICE_PROBES.items():
            try:
                getattr(peers.stub(address, stub_class), method)(request(), timeout=timeout)
            except grpc.RpcError as exc:
                if is_unimplemented(exc):
                    continue  # not this service's API: try the next
                if answered_error(exc) is None:
                    return None  # no Sluice answer at all (unreachable, timed out, another server)
            return name
        return None
    finally:
        peers.close()


def wrong_port_error(bootstrap: str, detail: str) -> CliError:
    """The error for an UNIMPLEMENTED answer from the bootstrap address."""
    first = bootstrap.split(",", maxsplit=1)[0].strip()
    who = identify_port(first)
    said = (
        f"{first} is {who}'s port, not the coordinator's"
        if who and who != "the coordinator"
        else (
            f"the service at {first} does not serve this call ({detail}): another service's port, or an "
            "older release"
        )
    )
    return CliError("WRONG_SERVICE", f"{said}. {HINT}")
