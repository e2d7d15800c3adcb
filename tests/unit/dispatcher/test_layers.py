"""The dispatcher's three layers (docs/architecture.md, "The dispatcher"), checked on the source.

Read as source, so it holds for every code path: the core imports no protobuf type of the
dispatcher's API, the adapters validate no request value, no module of the package imports
(even only for type checking) a module that imports it back, and no module is over 500 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sluice.dispatcher

PACKAGE = Path(sluice.dispatcher.__file__).parent
#: Translate between protobuf (gRPC, wire frames) and the core, and nothing else.
ADAPTERS = {"servicer.py", "wire_server.py", "convert.py", "events.py"}
#: Wiring (process start-up) and the one core module that knows a message's wire form: a record's
#: ``PushedMessage`` bytes are encoded once when it is read and shared by every subscription.
NOT_CORE = ADAPTERS | {"main.py", "__init__.py", "messages.py"}
#: The errors a request's values earn; an adapter that names one is validating.
REQUEST_ERRORS = {
    "InvalidArgument",
    "InvalidPermits",
    "InvalidRequest",
    "InvalidTopic",
    "InvalidFilter",
    "UnknownTopicOrPartition",
    "UnknownMessageId",
    "UnknownSubscription",
    "ConsumerBusy",
    "SubscriptionTypeMismatch",
    "SubscriptionInUse",
}


def _modules() -> list[Path]:
    return sorted(PACKAGE.glob("*.py"))


def _imports(path: Path) -> set[str]:
    """Every ``sluice.*`` module ``path`` imports, type-checking-only imports included."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), path.name)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sluice"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)  # ``from sluice.x import mod``
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("sluice"))
    return out


@pytest.mark.parametrize("path", [p for p in _modules() if p.name not in NOT_CORE], ids=lambda p: p.name)
def test_the_core_imports_no_protobuf_type_of_the_dispatcher_api(path: Path) -> None:
    assert "sluice.v1.dispatcher_pb2" not in _imports(path), f"{path.name} touches dispatcher protobuf"


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_adapters_raise_and_build_no_request_errors(name: str) -> None:
    tree = ast.parse((PACKAGE / name).read_text(), name)
    named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        alias.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for alias in n.names
    }
    assert not named & REQUEST_ERRORS, f"{name} validates requests itself: {named & REQUEST_ERRORS}"


def test_no_import_cycle_in_the_package() -> None:
    prefix = "sluice.dispatcher."
    graph = {
        p.stem: {
            m[len(prefix) :] for m in _imports(p) if m.startswith(prefix) and "." not in m[len(prefix) :]
        }
        for p in _modules()
    }
    graph = {k: {d for d in v if d in graph and d != k} for k, v in graph.items()}
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            cycle = [*path[path.index(node) :], node]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if node in done:
            return
        for dep in sorted(graph[node]):
            visit(dep, [*path, node])
        done.add(node)

    for module in sorted(graph):
        visit(module, [])


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_no_module_is_over_500_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= 500, f"{path.name} has {lines} lines: split it along its seams"
