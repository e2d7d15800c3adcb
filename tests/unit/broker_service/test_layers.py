"""The broker's transport adapters translate and do nothing else (docs/architecture.md).

Read as source, so it holds for code paths no other test reaches: the gRPC servicer, the
shared protobuf handlers and the wire connections neither validate a request (no request
error raised or built, no limit checked) nor reach past the core's operations into its parts
(the registry, the parked reads, the sessions, the logs).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sluice.broker

BROKER = Path(sluice.broker.__file__).parent
ADAPTERS = ("servicer.py", "handlers.py", "wire_server.py")

#: What only the core may touch: its parts, and the read steps a follow or long-poll uses.
CORE_INTERNALS = {
    "registry",
    "waiters",
    "sessions",
    "caps",
    "flusher",
    "logs",
    "begin_read",
    "read_again",
    "finish_read",
    "parked_read",
    "validate_limits",
    "prepare_partition",
    "check_continuous",
}
#: The request errors the core raises; an adapter that names one is validating.
REQUEST_ERRORS = {
    "InvalidArgument",
    "InvalidRequest",
    "OffsetOutOfRange",
    "CorruptBatch",
    "BatchTooLarge",
    "UnknownTopicOrPartition",
    "InvalidTopic",
    "InvalidFilter",
    "NotLeader",
}


def _tree(name: str) -> ast.Module:
    return ast.parse((BROKER / name).read_text(), name)


@pytest.mark.parametrize("name", ADAPTERS)
def test_adapters_raise_and_build_no_request_errors(name: str) -> None:
    tree = _tree(name)
    named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        alias.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for alias in n.names
    }
    assert not named & REQUEST_ERRORS, f"{name} validates requests itself: {named & REQUEST_ERRORS}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            # The only raise an adapter may have: a frame type the protocol does not know.
            assert "WireProtocolError" in ast.unparse(node.exc), f"{name}:{node.lineno} raises"


@pytest.mark.parametrize("name", ADAPTERS)
def test_adapters_call_the_core_operations_only(name: str) -> None:
    tree = _tree(name)
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
    }
    assert not used & CORE_INTERNALS, f"{name} reaches into the core: {used & CORE_INTERNALS}"


def test_there_is_one_parked_read_mechanism() -> None:
    """Long-poll (``service``) and follow (``follow``) both park through ``longpoll.ParkedRead``,
    made in one place; nothing else registers with the append waiters."""
    for path in sorted(BROKER.glob("*.py")):
        source = path.read_text()
        if path.name != "longpoll.py":
            assert ".watch(" not in source, f"{path.name} registers with the append waiters itself"
            assert "class Waiter" not in source, path.name
            assert "Watcher" not in source, path.name
        if path.name not in ("longpoll.py", "service.py"):
            assert "ParkedRead(" not in source, f"{path.name} makes its own parked read"
    assert "parked_read(" in (BROKER / "follow.py").read_text()
    assert "self.parked_read(" in (BROKER / "service.py").read_text()
