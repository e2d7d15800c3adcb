"""A real Prometheus on loopback for tests: `run_prometheus(targets)` scrapes the given endpoints every
second and answers PromQL through its HTTP API. The binary is the Debian package (`make deps`); a
missing binary is an error, never a skip."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness import free_port

SCRAPE_INTERVAL_S = 1


class PrometheusError(RuntimeError):
    pass


@dataclass(frozen=True)
class Target:
    job: str
    address: str  # host:port of a /metrics endpoint


def find_prometheus() -> str:
    exe = shutil.which("prometheus")
    if exe is None:
        raise PrometheusError(
            "no `prometheus` binary on PATH: install the Debian package (`make deps` runs "
            "scripts/install-tools.sh, or `apt-get install --no-install-recommends prometheus`)"
        )
    return exe


def scrape_config(targets: list[Target], labels: Mapping[str, str]) -> dict[str, Any]:
    """Prometheus configuration (JSON is valid YAML): one job per target, static labels on every target."""
    interval = f"{SCRAPE_INTERVAL_S}s"
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": t.job,
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [t.address], "labels": dict(labels)}],
            }
            for t in targets
        ],
    }


class Prometheus:
    """The HTTP API of one running Prometheus."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.proc = proc
        self.log = log

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:  # 400/422: a bad query; the body says why
            body = json.load(exc)
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("/api/v1/query", **params)
        if data["resultType"] in ("scalar", "string"):  # one value, shaped like a vector's sample
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        data = self.api(
            "/api/v1/query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=str(step)
        )
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, label: str, selector: str, start: float, end: float) -> list[str]:
        params = {"start": f"{start:.3f}", "end": f"{end:.3f}"}
        if selector:
            params["match[]"] = selector
        values: list[str] = self.api(f"/api/v1/label/{urllib.parse.quote(label)}/values", **params)
        return values

    def wait_targets_up(self, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            active = self.api("/api/v1/targets", state="active")["activeTargets"]
            if len(active) == count and all(t["health"] == "up" for t in active):
                return
            if time.monotonic() > deadline:
                raise PrometheusError(f"targets not all up after {timeout}s: {json.dumps(active, indent=1)}")
            time.sleep(0.2)  # Prometheus has no push notification for target health

    def wait_scraped_after(self, moment: float, selector: str, count: int, timeout: float = 15) -> None:
        """Until every one of ``count`` targets has been scraped after ``moment`` (Unix time)."""
        deadline = time.monotonic() + timeout
        expr = f"count(timestamp(up{{{selector}}}) > {moment:.3f})"
        while True:
            result = self.query(expr)
            if result and int(float(result[0]["value"][1])) >= count:
                return
            if time.monotonic() > deadline:
                raise PrometheusError(f"not every target was scraped after {moment} within {timeout}s")
            time.sleep(0.2)

    def wait_until(self, expr: str, timeout: float = 30) -> None:
        """Until ``expr`` (e.g. ``increase(x[15s]) > 0``) has a result: what a panel needs was scraped."""
        deadline = time.monotonic() + timeout
        while not has_number(self.query(expr)):
            if time.monotonic() > deadline:
                raise PrometheusError(f"no result for {expr} within {timeout}s")
            time.sleep(0.2)


def has_number(series: list[dict[str, Any]]) -> bool:
    """True when some sample of an instant or range result is a number (not NaN): a panel would draw it."""
    for s in series:
        samples = s.get("values") or [s["value"]]
        if any(not math.isnan(float(v)) for _, v in samples):
            return True
    return False


@contextmanager
def run_prometheus(directory: Path, targets: list[Target], labels: Mapping[str, str]) -> Iterator[Prometheus]:
    """Prometheus scraping ``targets`` every second with ``labels`` on each, storage under ``directory``."""
    exe = find_prometheus()
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "prometheus.yml"
    config.write_text(json.dumps(scrape_config(targets, labels), indent=2))
    port = free_port()
    log = directory / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                exe,
                f"--config.file={config}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    prom = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    try:
        _wait_ready(prom, timeout=30)
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _wait_ready(prom: Prometheus, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if prom.proc.poll() is not None:
            raise PrometheusError(
                f"prometheus exited with {prom.proc.returncode}:\n{prom.log.read_text()[-4000:]}"
            )
        try:
            with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        if time.monotonic() > deadline:
            raise PrometheusError(f"prometheus not ready after {timeout}s:\n{prom.log.read_text()[-4000:]}")
        time.sleep(0.1)  # no readiness line to wait on at --log.level=warn
