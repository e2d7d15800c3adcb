"""``sluice quota set|list|delete`` against a real coordinator (and the broker applying it)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.harness import ROOT, _env

from .conftest import QuotaCluster


def _sluice(cluster: QuotaCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice", "-b", cluster.coordinator.address, "quota", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        cwd=ROOT,
        check=False,
    )


def test_set_list_delete(cluster: QuotaCluster) -> None:
    done = _sluice(cluster, "set", "--client-id", "cli-app", "--produce-rate", "2MiB", "--request-rate", "50")
    assert done.returncode == 0, done.stderr
    assert "client:cli-app" in done.stdout
    done = _sluice(cluster, "set", "--default-user", "--fetch-rate", "10MB", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["entity"] == {"kind": "user", "name": "", "default": True}

    listed = json.loads(_sluice(cluster, "list", "--json").stdout)
    by_entity = {(q["entity"]["kind"], q["entity"]["name"]): q["limits"] for q in listed}
    assert by_entity[("client", "cli-app")] == {
        "produce_bytes_per_second": 2 * 1024 * 1024,
        "requests_per_second": 50,
    }
    assert by_entity[("user", "")] == {"fetch_bytes_per_second": 10_000_000}
    text = _sluice(cluster, "list", "--client").stdout
    assert "client:cli-app" in text
    assert "user:<default>" not in text

    # `set` replaces: the request rate is gone.
    assert _sluice(cluster, "set", "--client-id", "cli-app", "--produce-rate", "1MiB").returncode == 0
    listed = json.loads(_sluice(cluster, "list", "--client", "--json").stdout)
    limits = next(q["limits"] for q in listed if q["entity"]["name"] == "cli-app")
    assert limits == {"produce_bytes_per_second": 1024 * 1024}

    done = _sluice(cluster, "delete", "--client-id", "cli-app")
    assert done.returncode == 0, done.stderr
    assert "Deleted" in done.stdout
    assert "cli-app" not in _sluice(cluster, "list").stdout
    done = _sluice(cluster, "delete", "--default-user")
    assert done.returncode == 0, done.stderr


def test_bad_input_is_a_usage_error_or_typed(cluster: QuotaCluster) -> None:
    done = _sluice(cluster, "set", "--client-id", "x")
    assert done.returncode == 2
    assert "give at least one" in done.stderr
    done = _sluice(cluster, "set", "--client-id", "x", "--produce-rate", "lots")
    assert done.returncode == 2
    assert "invalid size" in done.stderr
    done = _sluice(cluster, "set", "--client-id", "x" * 1000, "--produce-rate", "1MiB")
    assert done.returncode == 1
    assert "at most 256" in done.stderr
    assert len(done.stderr) < 1000
    assert "Traceback" not in done.stderr + done.stdout
