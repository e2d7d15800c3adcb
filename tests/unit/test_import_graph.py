"""No import cycle inside any package of ``services/sluice``.

Every module is parsed with ``ast``; every ``import sluice...`` and ``from sluice... import`` counts,
wherever it is: module level, inside a function (a lazy import hides a cycle, it does not remove it), and
under ``if TYPE_CHECKING:`` (a cycle only the type checker sees still ties the two modules together: neither
can be read, tested or moved without the other). Relative imports are resolved too.

For each package P the graph has one node per direct child of P (a module, or a subpackage standing for
every module inside it) plus P's ``__init__``; an import from anything inside one child to anything inside
another is an edge. A strongly connected component of more than one node is a cycle. So
``sluice.dispatcher.a <-> sluice.dispatcher.b`` is one, and so is ``sluice.coordinator.cluster.x ->
sluice.coordinator.groups.y -> sluice.coordinator.cluster.z`` (a cycle between two subpackages).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

SERVICES = Path(__file__).resolve().parents[2] / "services"

# Cycles other engineers are removing right now (issue 13). This allowance must shrink to EMPTY: the lead
# empties it once their branches are merged, and nothing may be added to it. An entry is one whole cycle
# (a strongly connected component, exactly): a module joining a known cycle, or any other cycle, fails.
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()


def modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's ``__init__``), for every module under ``root/sluice``."""
    out = {}
    for path in sorted((root / "sluice").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = (path, is_package)
    return out


def _existing(name: str, known: Mapping[str, object]) -> str:
    """The module ``name`` lives in: itself, or its closest parent that is a module (``a.b.Name``)."""
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imported(module: str, is_package: bool, tree: ast.AST, known: Mapping[str, object]) -> Iterator[str]:
    """The sluice modules ``tree`` imports, anywhere in it (functions and TYPE_CHECKING blocks included)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "sluice" or alias.name.startswith("sluice."):
                    yield _existing(alias.name, known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source != "sluice" and not source.startswith("sluice."):
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"  # `from sluice.cli import consume` imports a module
                yield submodule if submodule in known else _existing(source, known)


def import_graph(root: Path) -> dict[str, set[str]]:
    known = modules(root)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in known.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = {t for t in imported(name, is_package, tree, known) if t != name}
    return graph


def _child(package: str, module: str) -> str | None:
    """The direct child of ``package`` that ``module`` is or is inside; the package itself for its
    ``__init__``; None outside it."""
    if module == package:
        return package
    if not module.startswith(package + "."):
        return None
    return f"{package}.{module[len(package) + 1 :].split('.', maxsplit=1)[0]}"


def _components(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def package_cycles(graph: Mapping[str, set[str]], packages: set[str]) -> list[frozenset[str]]:
    """Every cycle between the direct children of one package, for every package."""
    cycles = []
    for package in sorted(packages):
        collapsed: dict[str, set[str]] = {}
        for module, targets in graph.items():
            src = _child(package, module)
            if src is None:
                continue
            for target in targets:
                dst = _child(package, target)
                if dst is not None and dst != src:
                    collapsed.setdefault(src, set()).add(dst)
        cycles.extend(_components(collapsed))
    return cycles


def cycles_in(root: Path) -> list[frozenset[str]]:
    packages = {name for name, (_, is_package) in modules(root).items() if is_package}
    return package_cycles(import_graph(root), packages)


def _show(cycle: frozenset[str]) -> str:
    return " <-> ".join(sorted(cycle))


def test_no_import_cycle_within_a_package() -> None:
    unknown = [c for c in cycles_in(SERVICES) if c not in KNOWN_CYCLES]
    assert not unknown, "import cycles (restructure; do not hide them in functions):\n" + "\n".join(
        map(_show, unknown)
    )


def test_known_cycles_are_still_there() -> None:
    """A cycle that was removed must leave KNOWN_CYCLES, so the allowance only shrinks."""
    gone = KNOWN_CYCLES - set(cycles_in(SERVICES))
    assert not gone, "remove from KNOWN_CYCLES (they are gone, or changed shape):\n" + "\n".join(
        map(_show, gone)
    )


def _write(root: Path, module: str, text: str) -> None:
    path = root.joinpath(*module.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    for parent in path.relative_to(root).parents:
        if parent != Path("."):
            (root / parent / "__init__.py").touch()
    path.write_text(text)


@pytest.mark.parametrize(
    ("files", "cycle"),
    [
        pytest.param(
            {"sluice.pkg.a": "from sluice.pkg.b import B\n", "sluice.pkg.b": "from sluice.pkg.a import A\n"},
            {"sluice.pkg.a", "sluice.pkg.b"},
            id="module-level",
        ),
        pytest.param(
            {
                "sluice.pkg.a": "def f():\n    from sluice.pkg import b\n",
                "sluice.pkg.b": "import sluice.pkg.a\n",
            },
            {"sluice.pkg.a", "sluice.pkg.b"},
            id="function-level-and-plain-import",
        ),
        pytest.param(
            {
                "sluice.pkg.a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
                "sluice.pkg.b": "from sluice.pkg.c import C\n",
                "sluice.pkg.c": "from sluice.pkg.a import A\n",
            },
            {"sluice.pkg.a", "sluice.pkg.b", "sluice.pkg.c"},
            id="type-checking-relative-three-modules",
        ),
        pytest.param(
            {
                "sluice.pkg.x.one": "from sluice.pkg.y.two import T\n",
                "sluice.pkg.y.two": "from sluice.pkg.x import other\n",
                "sluice.pkg.x.other": "",
            },
            {"sluice.pkg.x", "sluice.pkg.y"},
            id="between-subpackages",
        ),
    ],
)
def test_the_check_finds_cycles(tmp_path: Path, files: dict[str, str], cycle: set[str]) -> None:
    """The check itself: each kind of import it must see, planted in a scratch tree."""
    for module, text in files.items():
        _write(tmp_path, module, text)
    assert cycles_in(tmp_path) == [frozenset(cycle)]


def test_a_cycle_across_packages_is_found_in_their_common_parent(tmp_path: Path) -> None:
    """pkg -> other -> pkg is a cycle between two children of ``sluice``; without the back edge, none."""
    _write(tmp_path, "sluice.pkg.a", "from sluice.pkg.b import B\nfrom sluice.other import o\n")
    _write(tmp_path, "sluice.pkg.b", "import json\nfrom sluice.other.deep import d\n")
    _write(tmp_path, "sluice.other.deep", "from sluice.pkg import a\n")
    assert cycles_in(tmp_path) == [frozenset({"sluice.other", "sluice.pkg"})]
    _write(tmp_path, "sluice.other.deep", "")
    assert cycles_in(tmp_path) == []
