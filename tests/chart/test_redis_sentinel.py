"""The bundled Redis as a primary with replicas and a Sentinel per pod (components.redis.sentinel)."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sluice.common.redis_client import parse_sentinel_url
from tests.chart.chartlib import CHART, Manifest, one, render, render_error

SENTINEL_VALUES = CHART / "ci" / "values-redis-sentinel.yaml"


@pytest.fixture(scope="module")
def sentinel() -> list[Manifest]:
    return render([SENTINEL_VALUES])


def _containers(m: list[Manifest]) -> dict[str, dict[str, Any]]:
    spec = one(m, "StatefulSet", "sluice-redis")["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec["containers"]}


def test_every_pod_runs_redis_and_a_sentinel_found_through_a_headless_service(
    sentinel: list[Manifest],
) -> None:
    sts = one(sentinel, "StatefulSet", "sluice-redis")
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["serviceName"] == "sluice-redis-headless"
    headless = one(sentinel, "Service", "sluice-redis-headless")["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["publishNotReadyAddresses"] is True
    assert {p["name"] for p in headless["ports"]} == {"redis", "sentinel"}
    containers = _containers(sentinel)
    assert containers["redis"]["command"] == ["sh", "/etc/redis/start-redis.sh"]
    assert containers["sentinel"]["command"] == ["sh", "/etc/redis/start-sentinel.sh"]
    assert {p["containerPort"] for p in containers["sentinel"]["ports"]} == {26379}


def test_the_services_follow_the_primary_through_every_sentinel(sentinel: list[Manifest]) -> None:
    secret = one(sentinel, "Secret", "sluice-redis")["data"]
    url = base64.b64decode(secret["redis-url"]).decode()
    address = parse_sentinel_url(url)  # the services' own parser accepts it
    assert address.service_name == "sluice"
    assert [host for host, _ in address.sentinels] == [
        f"sluice-redis-{i}.sluice-redis-headless.sluice-test.svc.cluster.local" for i in range(3)
    ]
    assert address.password == base64.b64decode(secret["redis-password"]).decode()


def test_the_primary_refuses_writes_it_cannot_replicate(sentinel: list[Manifest]) -> None:
    conf = one(sentinel, "ConfigMap", "sluice-redis")["data"]["redis.conf"]
    assert "min-replicas-to-write 1" in conf
    assert "appendfsync always" in conf


def test_the_sentinel_port_is_open_to_the_services_and_between_redis_pods(sentinel: list[Manifest]) -> None:
    rendered = render([SENTINEL_VALUES], sets=["networkPolicy.enabled=true"])
    [rule] = one(rendered, "NetworkPolicy", "sluice-redis")["spec"]["ingress"]
    assert {p["port"] for p in rule["ports"]} == {6379, 26379}
    sources = [peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in rule["from"]]
    assert sorted(sources) == ["coordinator", "offset-store", "redis"]


@pytest.mark.parametrize("script", ["find-primary.sh", "start-redis.sh", "start-sentinel.sh"])
def test_the_start_up_scripts_are_valid_posix_shell(
    sentinel: list[Manifest], script: str, tmp_path: Path
) -> None:
    sh = shutil.which("dash") or shutil.which("sh")
    assert sh is not None
    path = tmp_path / script
    path.write_text(one(sentinel, "ConfigMap", "sluice-redis")["data"][script])
    proc = subprocess.run([sh, "-n", str(path)], capture_output=True, text=True, timeout=10, check=False)
    assert proc.returncode == 0, proc.stderr


def test_with_no_sentinel_answering_pod_zero_is_the_primary(sentinel: list[Manifest], tmp_path: Path) -> None:
    """The first install: no Sentinel runs yet, so every pod agrees on pod 0 (and pod 0 on itself)."""
    script = tmp_path / "find-primary.sh"
    script.write_text(one(sentinel, "ConfigMap", "sluice-redis")["data"]["find-primary.sh"])
    env = {
        "PATH": "/usr/bin:/bin",
        "POD_NAME": "r-0",
        "HEADLESS_SERVICE": "invalid.",  # resolves nowhere: no Sentinel answers
        "STATEFULSET": "r",
        "REDIS_REPLICAS": "3",
        "SENTINEL_PORT": "1",
        "MASTER_NAME": "sluice",
    }
    proc = subprocess.run(
        ["sh", "-c", f'. {script} && echo "$me $primary"'],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=env,
    )
    assert proc.stdout.split() == ["r-0.invalid.", "r-0.invalid."], proc.stderr


@pytest.mark.parametrize(
    ("sets", "complaint"),
    [
        (["components.redis.replicas=3"], "without components.redis.sentinel.enabled"),
        (["components.redis.sentinel.enabled=true"], "run at least 3 pods"),
        (
            ["components.redis.sentinel.enabled=true", "components.redis.replicas=4"],
            "must be more than half",
        ),
        (
            [
                "components.redis.sentinel.enabled=true",
                "components.redis.replicas=3",
                "components.redis.sentinel.minReplicasToWrite=3",
            ],
            "every write would be refused",
        ),
    ],
)
def test_contradictory_sentinel_settings_are_refused(sets: list[str], complaint: str) -> None:
    assert complaint in render_error(sets=sets)
