"""Reading the chart's Grafana dashboards the way Grafana would: their queries, their template
variables, and the metric names the queries read. Pure functions, no I/O beyond loading the files."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARD_DIR = Path(__file__).resolve().parents[2] / "charts" / "sluice" / "dashboards"

# A Sluice metric name as it appears in PromQL: not preceded by a name character, `$` (a Grafana
# variable) or `"` (a label value or a regex on __name__, which this check could not verify).
METRIC_NAME = re.compile(r'(?<![\w$"])sluice_[a-zA-Z0-9_:]*')
# Grafana's variable syntaxes: $name, ${name}, ${name:format} and the deprecated [[name]].
VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)\]\]")
# label_values(selector, label) and label_values(label): the variable queries of the Prometheus datasource.
LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<selector>.+?)\s*,\s*)?(?P<label>\w+)\s*\)\s*$", re.S)


@dataclass(frozen=True)
class Query:
    """One panel target: where it is (for messages) and its PromQL."""

    dashboard: str
    panel: str
    ref_id: str
    expr: str

    @property
    def where(self) -> str:
        return f"{self.dashboard} / {self.panel!r} / {self.ref_id}"


@dataclass(frozen=True)
class VariableQuery:
    """A `label_values(...)` template variable."""

    dashboard: str
    name: str
    selector: str
    label: str


def dashboard_paths(directory: Path = DASHBOARD_DIR) -> list[Path]:
    return sorted(directory.glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _panels(panels: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # rows (collapsed or not) may hold panels


def queries(name: str, dashboard: Mapping[str, Any]) -> list[Query]:
    found = []
    for panel in _panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if not target.get("hide"):
                found.append(Query(name, panel.get("title", "?"), target.get("refId", "?"), target["expr"]))
    return found


def variable_queries(name: str, dashboard: Mapping[str, Any]) -> list[VariableQuery]:
    found = []
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or var.get("definition", ""))
        m = LABEL_VALUES.match(text)
        if m is None:
            raise ValueError(f"{name}: variable {var['name']!r} is not a label_values(...) query: {text!r}")
        found.append(VariableQuery(name, var["name"], m.group("selector") or "", m.group("label")))
    return found


def metric_names(expr: str) -> set[str]:
    """Every sluice_* metric name an expression reads (sample names: `_total`, `_bucket` included)."""
    return set(METRIC_NAME.findall(expr))


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Fill Grafana variables in; an unknown variable is an error (the query could never run)."""

    def fill(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in values:
            raise KeyError(f"no value for template variable ${name} in {expr!r}")
        return values[name]

    return VARIABLE.sub(fill, expr)


def exported_names(exposition: str) -> set[str]:
    """Sample names in Prometheus text exposition format (what a scrape of /metrics returns)."""
    names = set()
    for line in exposition.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


def unexported(queries: Iterable[Query | VariableQuery], exported: set[str]) -> dict[str, set[str]]:
    """{where: names} for every query that reads a sluice_* metric no service exports."""
    missing: dict[str, set[str]] = {}
    for q in queries:
        text = q.expr if isinstance(q, Query) else q.selector
        where = q.where if isinstance(q, Query) else f"{q.dashboard} / variable ${q.name}"
        names = metric_names(text) - exported
        if names:
            missing[where] = names
    return missing
