"""The replication alerts (charts/sluice/alerts/*.yaml) ship as a PrometheusRule behind
monitoring.rules.enabled, and do what they say under a real promtool: `promtool check rules` on what the
chart renders, and `promtool test rules` feeding it series (docs/kubernetes.md, "Alerts")."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.chartlib import CHART, find, render

ALERTS = CHART / "alerts" / "replication.yaml"
NS = {"namespace": "shop"}


def promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail(
            "no `promtool` on PATH: install the Debian package `prometheus` (scripts/install-tools.sh)"
        )
    return exe


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    (rule,) = find(
        render(sets=["monitoring.rules.enabled=true", "monitoring.rules.labels.release=kps"]),
        "PrometheusRule",
    )
    return rule


def test_off_by_default_and_shipped_unchanged_when_on(rendered: dict[str, Any]) -> None:
    assert not find(render(), "PrometheusRule")
    assert rendered["metadata"]["labels"]["release"] == "kps"
    shipped = [
        g for f in sorted(ALERTS.parent.glob("*.yaml")) for g in yaml.safe_load(f.read_text())["groups"]
    ]
    assert rendered["spec"]["groups"] == shipped
    names = {r["alert"] for g in rendered["spec"]["groups"] for r in g["rules"]}
    assert names >= {
        "SluiceUnderReplicatedPartitions",
        "SluiceOfflinePartitions",
        "SluiceUncleanLeaderElection",
    }


def _write_rules(tmp_path: Path, rendered: dict[str, Any]) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rendered["spec"]["groups"]}))
    return path


def test_promtool_checks_the_rendered_rules(tmp_path: Path, rendered: dict[str, Any]) -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(_write_rules(tmp_path, rendered))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rules = sum(len(g["rules"]) for g in rendered["spec"]["groups"])
    assert f"{rules} rules found" in result.stdout


def _annotations(alert: str, **values: str) -> dict[str, str]:
    rule = next(
        r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"] if r["alert"] == alert
    )
    out = {}
    for key, template in rule["annotations"].items():
        text = template.replace("{{ $labels.namespace }}", NS["namespace"])
        for name, value in values.items():
            text = text.replace("{{ $" + name + " }}", value)
        out[key] = text
    return out


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    selector = ", ".join(f'{k}="{v}"' for k, v in {**NS, **labels}.items())
    return {"series": f"{name}{{{selector}}}", "values": values}


def test_promtool_unit_tests_pass(tmp_path: Path, rendered: dict[str, Any]) -> None:
    """Under-replicated fires after 5 minutes above 0, counting the leading coordinator only (the standby's
    stale 7 is ignored); offline after a minute; an unclean election at once, a clean one never."""
    leader = {"instance": "c0"}
    standby = {"instance": "c1"}
    tests = {
        "rule_files": [str(_write_rules(tmp_path, rendered))],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    _series("sluice_coordinator_election_leader", "1x20", **leader),
                    _series("sluice_coordinator_election_leader", "0x20", **standby),
                    _series("sluice_coordinator_partitions_under_replicated", "0 0 2x18", **leader),
                    _series("sluice_coordinator_partitions_under_replicated", "7x20", **standby),
                    _series("sluice_coordinator_partitions_offline", "0x5 1x15", **leader),
                    _series("sluice_coordinator_partitions_offline", "3x20", **standby),
                    _series("sluice_coordinator_leader_elections_total", "0 0 1x18", kind="clean", **leader),
                    _series(
                        "sluice_coordinator_leader_elections_total", "0x8 1x12", kind="unclean", **leader
                    ),
                ],
                "alert_rule_test": [
                    # Pending from 2m: not firing before 7m.
                    {"eval_time": "6m", "alertname": "SluiceUnderReplicatedPartitions", "exp_alerts": []},
                    {
                        "eval_time": "8m",
                        "alertname": "SluiceUnderReplicatedPartitions",
                        "exp_alerts": [
                            {
                                "exp_labels": {**NS, "severity": "warning"},
                                "exp_annotations": _annotations("SluiceUnderReplicatedPartitions", value="2"),
                            }
                        ],
                    },
                    {"eval_time": "5m", "alertname": "SluiceOfflinePartitions", "exp_alerts": []},
                    {
                        "eval_time": "7m",
                        "alertname": "SluiceOfflinePartitions",
                        "exp_alerts": [
                            {
                                "exp_labels": {**NS, "severity": "critical"},
                                "exp_annotations": _annotations("SluiceOfflinePartitions", value="1"),
                            }
                        ],
                    },
                    {"eval_time": "7m", "alertname": "SluiceUncleanLeaderElection", "exp_alerts": []},
                    {
                        "eval_time": "10m",
                        "alertname": "SluiceUncleanLeaderElection",
                        "exp_alerts": [
                            {
                                "exp_labels": {**NS, "severity": "critical"},
                                "exp_annotations": _annotations("SluiceUncleanLeaderElection"),
                            }
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
