"""The broker storage alerts (charts/sluice/alerts/storage.yaml) under a real promtool: they fire at the
threshold the broker exports (twice its minimum of free bytes; below the minimum), per broker and log
directory, and not for a broker with room (docs/storage.md, "Disk full")."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.chart.chartlib import CHART
from tests.chart.test_alert_rules import promtool

RULES = CHART / "alerts" / "storage.yaml"
MiB = 1024 * 1024
LABELS = {"namespace": "shop", "log_dir": "/data"}


def _series(name: str, values: str, instance: str) -> dict[str, str]:
    selector = ", ".join(f'{k}="{v}"' for k, v in {**LABELS, "instance": instance}.items())
    return {"series": f"{name}{{{selector}}}", "values": values}


def _alert(name: str, instance: str, severity: str, summary: str) -> dict[str, object]:
    rule = next(
        r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if r["alert"] == name
    )
    return {
        "exp_labels": {**LABELS, "instance": instance, "severity": severity},
        "exp_annotations": {"summary": summary, "description": rule["annotations"]["description"]},
    }


def test_promtool_checks_the_storage_rules() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 rules found" in result.stdout


def test_the_storage_alerts_fire_at_their_thresholds(tmp_path: Path) -> None:
    """b0 goes from 1 GiB free to 200 MiB (under 2 x 128 MiB) at 2m, then 100 MiB (under the minimum) at
    10m; b1 stays at 1 GiB. Low fires 5 minutes after 2m, full a minute after 10m; b1 never."""
    minimum = str(128 * MiB)
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    _series("sluice_broker_disk_min_free_bytes", f"{minimum}x20", "b0"),
                    _series("sluice_broker_disk_min_free_bytes", f"{minimum}x20", "b1"),
                    _series(
                        "sluice_broker_disk_free_bytes", f"{1024 * MiB}x1 {200 * MiB}x8 {100 * MiB}x10", "b0"
                    ),
                    _series("sluice_broker_disk_free_bytes", f"{1024 * MiB}x20", "b1"),
                ],
                "alert_rule_test": [
                    {"eval_time": "6m", "alertname": "SluiceBrokerDiskLow", "exp_alerts": []},
                    {
                        "eval_time": "8m",
                        "alertname": "SluiceBrokerDiskLow",
                        "exp_alerts": [
                            _alert(
                                "SluiceBrokerDiskLow",
                                "b0",
                                "warning",
                                "Sluice broker b0 has 200MiB free in /data",
                            )
                        ],
                    },
                    {"eval_time": "10m", "alertname": "SluiceBrokerDiskFull", "exp_alerts": []},
                    {
                        "eval_time": "12m",
                        "alertname": "SluiceBrokerDiskFull",
                        "exp_alerts": [
                            _alert(
                                "SluiceBrokerDiskFull",
                                "b0",
                                "critical",
                                "Sluice broker b0 refuses produce: /data is full",
                            )
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
