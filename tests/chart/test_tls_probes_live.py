"""The chart's TLS probe, exactly as rendered, against a real service started with the chart's own env.

A kubelet probe that cannot pass restarts every pod forever; the render tests alone would not see a path,
port or scheme the service does not serve. So: render the offset store under TLS (and the metrics port
over TLS), point the mounted-file paths of its env at real files, start ``sluice offset-store`` with that
env and a private Redis, and ask the readiness probe's URL the way the kubelet does (HTTPS without
verifying the certificate, no credentials).
"""

from __future__ import annotations

import shutil
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from sluice.security.certs import issue, write_ca
from tests.chart.chartlib import Manifest, one, render
from tests.harness import run_redis, run_service

PREFIX = "SLUICE_OFFSET_STORE_"


def _container(m: list[Manifest]) -> dict[str, Any]:
    c: dict[str, Any] = one(m, "Deployment", "sluice-offset-store")["spec"]["template"]["spec"]["containers"][
        0
    ]
    return c


def _kubelet_get(url: str) -> tuple[int, str]:
    """An HTTP(S) GET as the kubelet's httpGet probe makes it: the certificate is not verified."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _secret_files(tmp_path: Path) -> Path:
    """What the chart's `tls` volume holds: tls.crt, tls.key and ca.crt."""
    ca = write_ca(tmp_path / "ca")
    issued = issue(ca, tmp_path / "issued", "sluice-offset-store", ["sluice-offset-store"])
    tls = tmp_path / "tls"
    tls.mkdir()
    shutil.copy(issued.cert_path, tls / "tls.crt")
    shutil.copy(issued.key_path, tls / "tls.key")
    shutil.copy(tmp_path / "ca" / "ca.crt", tls / "ca.crt")
    return tls


@pytest.mark.parametrize("metrics_tls", [False, True], ids=["http", "https"])
def test_the_rendered_tls_probe_passes_against_the_service_run_with_the_charts_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metrics_tls: bool
) -> None:
    sets = ["tls.enabled=true", "tls.existingSecret=s", "tls.clientAuth=require"]
    c = _container(render(sets=[*sets, f"tls.metrics={str(metrics_tls).lower()}"]))
    checks = [c[p]["httpGet"] for p in ("startupProbe", "readinessProbe", "livenessProbe")]
    assert checks == [checks[0]] * 3
    check = checks[0]
    assert check["port"] == "metrics"

    mount = {v["name"]: v["mountPath"] for v in c["volumeMounts"]}["tls"]
    files = _secret_files(tmp_path)
    env = {e["name"]: e["value"] for e in c["env"] if e["name"].startswith(PREFIX) and "value" in e}
    assert f"{PREFIX}TLS_CERT" in env
    for name, value in env.items():
        monkeypatch.setenv(name, value.replace(mount, str(files)))

    with run_redis() as redis:
        monkeypatch.setenv(f"{PREFIX}REDIS_URL", redis.url)
        with run_service("offset-store", "--host=127.0.0.1", "--port=0", "--metrics-port=0") as sp:
            port = int(sp.metrics.rsplit(":", 1)[1])
            url = f"{check['scheme'].lower()}://127.0.0.1:{port}{check['path']}"
            assert _kubelet_get(url) == (200, "SERVING\n"), sp.log()
            if metrics_tls:
                # The metrics port really is TLS-only: a plain HTTP probe there could never pass.
                with pytest.raises((urllib.error.URLError, ConnectionError)):
                    _kubelet_get(f"http://127.0.0.1:{port}{check['path']}")
