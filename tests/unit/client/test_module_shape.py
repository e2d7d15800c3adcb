"""The SDK's modules stay small and import each other in one direction.

Every module of ``sluice.client`` is at most 500 lines, and no two of them import each other,
directly or through others -- counting imports under ``if TYPE_CHECKING:`` too, since a cycle
hidden there is still a cycle in the design.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sluice.client

_ROOT = Path(sluice.client.__file__).parent
_PACKAGE = "sluice.client"
MAX_LINES = 500


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([_PACKAGE, *parts])


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(_ROOT.rglob("*.py"))}


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """module -> the modules of ``sources`` it imports (anywhere in its body)."""
    graph: dict[str, set[str]] = {name: set() for name in sources}
    for name, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # ``from pkg import mod`` imports the submodule pkg.mod when there is one.
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            for target in targets:
                if target in sources and target != name:
                    graph[name].add(target)
                    break
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_sdk_module_is_over_500_lines() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert len(sizes) > 40
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_the_cycle_check_sees_a_type_checking_cycle() -> None:
    sources = {
        "sluice.client.push.config": "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from sluice.client.push.consumer import PushConsumer\n",
        "sluice.client.push.consumer": "from sluice.client.push.config import PushConsumerConfig\n",
        "sluice.client.push": "from sluice.client.push.consumer import PushConsumer\n",
    }
    assert cycles(import_graph(sources)) == [["sluice.client.push.config", "sluice.client.push.consumer"]]


def test_no_import_cycle_in_the_sdk() -> None:
    graph = import_graph({name: path.read_text() for name, path in _modules().items()})
    assert graph["sluice.client.push.consumer"] >= {
        "sluice.client.push.config",
        "sluice.client.push.sessions",
    }
    assert cycles(graph) == []
