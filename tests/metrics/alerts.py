"""Reading the chart's alert rules (charts/sluice/alerts/*.yaml) for the real-Prometheus test: each rule's
expression, and its *signals*: the operands an alert compares against a threshold, which must return data
from a real scrape even while the alert (rightly) does not fire. Pure functions over the files."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

ALERT_DIR = Path(__file__).resolve().parents[2] / "charts" / "sluice" / "alerts"
SET_OPERATORS = ("and", "or", "unless")
COMPARISONS = (">=", "<=", "==", "!=", ">", "<")


@dataclass(frozen=True)
class Rule:
    file: str
    alert: str
    expr: str


def rules(directory: Path = ALERT_DIR) -> list[Rule]:
    found = []
    for path in sorted(directory.glob("*.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            found += [Rule(path.name, r["alert"], r["expr"]) for r in group["rules"] if "alert" in r]
    return found


def _top_level(expr: str) -> list[tuple[int, str]]:
    """(position, token) of every set operator and comparison outside parentheses, brackets and braces
    (so `unless on (...)` inside a `max by (...) (...)` is not split)."""
    found: list[tuple[int, str]] = []
    depth, i = 0, 0
    while i < len(expr):
        ch = expr[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == '"':
            i = expr.index('"', i + 1)  # a label value may hold anything
        elif depth == 0:
            word = re.match(r"\b(and|or|unless)\b", expr[i:])
            if word and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] == "_")):
                found.append((i, word.group(1)))
                i += len(word.group(1))
                continue
            op = next((c for c in COMPARISONS if expr.startswith(c, i)), None)
            if op:
                found.append((i, op))
                i += len(op)
                continue
        i += 1
    return found


def _unwrap(expr: str) -> str:
    expr = expr.strip()
    while expr.startswith("(") and expr.endswith(")"):
        inner = expr[1:-1]
        depth = 0
        for ch in inner:  # only if the outer pair encloses everything: "(a) > (b)" is not unwrapped
            depth += (ch == "(") - (ch == ")")
            if depth < 0:
                return expr
        expr = inner.strip()
    return expr


def signals(expr: str) -> list[str]:
    """The left operand of each comparison of each top-level `and`/`or` part: what the alert measures."""
    parts: list[str] = []
    start = 0
    for pos, token in _top_level(expr):
        if token in SET_OPERATORS:
            parts.append(expr[start:pos])
            start = pos + len(token)
    parts.append(expr[start:])
    out = []
    for raw in parts:
        part = _unwrap(raw)
        comparisons = [pos for pos, token in _top_level(part) if token in COMPARISONS]
        out.append(_unwrap(part[: comparisons[0]]) if comparisons else part)
    return out


def declared_names(exposition: str) -> set[str]:
    """Names a /metrics page declares (`# HELP name ...`), samples or not: a labelled counter such as
    ``sluice_internal_errors_total`` has no sample until its first event, but is declared from the start."""
    return {line.split()[2] for line in exposition.splitlines() if line.startswith("# HELP ")}
