"""What every alert-rule file's promtool test shares: a case (series that must make one alert fire after
its `for`, and not before), the annotations an operator will read, and one `promtool test rules` run over
a file's cases. Each rules file has a test module that lists its cases."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.chart.chartlib import ROOT
from tests.chart.test_alert_rules import promtool

RUNBOOK = ROOT / "docs" / "operations.md"
NS = "shop"
TEMPLATE = re.compile(r"\{\{\s*\$(labels\.(\w+)|value)[^}]*\}\}")


def rules_of(path: Path) -> dict[str, dict[str, Any]]:
    """The alerts of one rules file, by name."""
    return {r["alert"]: r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]}


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    selector = ", ".join(f'{k}="{v}"' for k, v in {"namespace": NS, **labels}.items())
    return {"series": f"{name}{{{selector}}}", "values": values}


@dataclass(frozen=True)
class Case:
    """``alert`` fires at ``fires_at`` (and not at ``quiet_at``) once, with ``labels``; ``value`` is how
    the annotations print `$value` at ``fires_at``."""

    alert: str
    inputs: list[dict[str, str]]
    quiet_at: str
    fires_at: str
    labels: dict[str, str]
    value: str = ""
    interval: str = "1m"
    extra: list[dict[str, str]] = field(default_factory=list)


def expected(rules: Path, case: Case) -> dict[str, Any]:
    """The alert promtool must see: the rule's labels and its annotations as they would be printed."""
    rule = rules_of(rules)[case.alert]
    labels = {"namespace": NS, **case.labels}

    def fill(m: re.Match[str]) -> str:
        return case.value if m.group(1) == "value" else labels[m.group(2)]

    return {
        "exp_labels": {**labels, **rule["labels"]},
        "exp_annotations": {k: TEMPLATE.sub(fill, v) for k, v in rule["annotations"].items()},
    }


def runbook_headings() -> set[str]:
    return set(re.findall(r"^### (Sluice\w+)", RUNBOOK.read_text(), re.M))


def run_promtool(rules: Path, cases: list[Case], tmp_path: Path) -> None:
    """Every case of ``rules`` under one real `promtool test rules`; fails with promtool's output."""
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": f"{c.alert} #{i}",
                "interval": c.interval,
                "input_series": c.inputs,
                "alert_rule_test": [
                    {"eval_time": c.quiet_at, "alertname": c.alert, "exp_alerts": []},
                    {"eval_time": c.fires_at, "alertname": c.alert, "exp_alerts": [expected(rules, c)]},
                ],
            }
            for i, c in enumerate(cases)
        ],
    }
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
