#!/usr/bin/env python3
"""Build the chart README's parameter tables from the ``## @param`` comments in values.yaml.

    python charts/sluice/hack/params.py           # rewrite the tables in charts/sluice/README.md
    python charts/sluice/hack/params.py --check   # exit 1 if README.md is out of date

Comment format (the Bitnami readme-generator's, so its tooling also works):
``## @section Title`` starts a table; ``## @param dotted.path Description`` documents a value. The
Value column is the default from values.yaml itself, so a changed default shows up as a stale README.
Every leaf of values.yaml must be documented, by its own @param or an ancestor's (an object such as
``resources`` is documented as a whole); an @param for a path that does not exist is an error too.
The tables live between ``<!-- params:start -->`` and ``<!-- params:end -->`` in README.md.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent.parent
START = "<!-- params:start -->"
END = "<!-- params:end -->"
_PARAM = re.compile(r"^\s*## @param\s+(\S+)\s+(.*\S)\s*$")
_SECTION = re.compile(r"^\s*## @section\s+(.*\S)\s*$")
_MISSING = object()


@dataclass
class Section:
    title: str
    params: list[tuple[str, str]] = field(default_factory=list)


class ParamsError(Exception):
    """values.yaml and its @param comments disagree."""


def parse(values_text: str) -> list[Section]:
    sections: list[Section] = []
    for line in values_text.splitlines():
        if m := _SECTION.match(line):
            sections.append(Section(m.group(1)))
        elif m := _PARAM.match(line):
            if not sections:
                sections.append(Section("Parameters"))
            sections[-1].params.append((m.group(1), m.group(2)))
    return [s for s in sections if s.params]


def lookup(values: Any, path: str) -> Any:
    node = values
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return _MISSING
        node = node[key]
    return node


def leaves(values: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every scalar, list and empty map in values."""
    if isinstance(values, dict) and values:
        out: list[str] = []
        for key, child in values.items():
            out += leaves(child, f"{prefix}.{key}" if prefix else str(key))
        return out
    return [prefix]


def check_coverage(values: Any, sections: list[Section]) -> None:
    documented = [path for s in sections for path, _ in s.params]
    problems = [
        f"@param {p} names no value in values.yaml" for p in documented if lookup(values, p) is _MISSING
    ]
    problems += [f"@param {p} is documented {n} times" for p, n in Counter(documented).items() if n > 1]
    seen = set(documented)
    for leaf in leaves(values):
        parts = leaf.split(".")
        if not any(".".join(parts[:i]) in seen for i in range(1, len(parts) + 1)):
            problems.append(f"{leaf} has no ## @param comment")
    if problems:
        raise ParamsError("\n".join(problems))


def escape(text: str) -> str:
    """A Markdown table cell: a literal | would end the cell."""
    return text.replace("|", "\\|")


def show(value: Any) -> str:
    return "`" + escape(json.dumps(value, separators=(", ", ": "))) + "`"


def tables(values_text: str) -> str:
    values = yaml.safe_load(values_text)
    sections = parse(values_text)
    check_coverage(values, sections)
    out: list[str] = []
    for section in sections:
        out += [f"### {section.title}", "", "| Name | Description | Value |", "| --- | --- | --- |"]
        for path, description in section.params:
            out.append(f"| `{path}` | {escape(description)} | {show(lookup(values, path))} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def splice(readme: str, generated: str) -> str:
    if START not in readme or END not in readme:
        raise ParamsError(f"README.md has no {START} ... {END} block")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{generated}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    readme_path = CHART / "README.md"
    readme = readme_path.read_text()
    try:
        updated = splice(readme, tables((CHART / "values.yaml").read_text()))
    except ParamsError as exc:
        print(f"params: {exc}", file=sys.stderr)
        return 1
    if "--check" in args:
        if updated != readme:
            print(
                "params: charts/sluice/README.md is out of date: run charts/sluice/hack/params.py",
                file=sys.stderr,
            )
            return 1
        return 0
    readme_path.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
