"""The chart for real clusters (ci/values-real-cluster.yaml): brokers spread across nodes and zones, one
LoadBalancer Service per broker whose name and ports the broker advertises, priorityClassName, and a user's
init containers, sidecars and volumes; every manifest valid under kubernetes-validate --strict."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.chart.chartlib import CHART, find, one, render, render_error, validate_manifests

VALUES = CHART / "ci" / "values-real-cluster.yaml"


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    return render([VALUES])


def test_validates_strictly(manifests: list[dict[str, Any]]) -> None:
    assert validate_manifests({"real-cluster": manifests}) == []


def test_brokers_spread_and_priority(manifests: list[dict[str, Any]]) -> None:
    pod = one(manifests, "StatefulSet", "sluice-broker")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "sluice-data"
    assert pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"


def test_one_external_service_per_broker_advertised(manifests: list[dict[str, Any]]) -> None:
    services = [s for s in find(manifests, "Service") if s["metadata"]["name"].endswith("-external")]
    assert [s["metadata"]["name"] for s in services] == [f"sluice-broker-{i}-external" for i in range(3)]
    for i, svc in enumerate(services):
        assert svc["spec"]["type"] == "LoadBalancer"
        assert svc["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == f"sluice-broker-{i}"
        assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"grpc": 443, "wire": 9443}
        hostname = svc["metadata"]["annotations"]["external-dns.alpha.kubernetes.io/hostname"]
        assert hostname == f"sluice-broker-{i}.sluice.example.com"
    args = one(manifests, "StatefulSet", "sluice-broker")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--advertised-host=$(POD_NAME).sluice.example.com" in args
    assert {"--advertised-port=443", "--advertised-wire-port=9443"} <= set(args)


def test_extra_containers_and_volumes(manifests: list[dict[str, Any]]) -> None:
    pod = one(manifests, "StatefulSet", "sluice-broker")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["broker", "log-shipper"]
    assert [c["name"] for c in pod["initContainers"]] == ["wait-for-volume"]
    assert {"fluent-bit-config", "ca-bundle"} <= {v["name"] for v in pod["volumes"]}
    assert "/etc/ssl/corporate" in {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    offset_store = one(manifests, "Deployment", "sluice-offset-store")["spec"]["template"]["spec"]
    assert [c["name"] for c in offset_store["containers"]] == ["offset-store", "sidecar"]


def test_defaults_add_nothing_but_the_zone_spread() -> None:
    manifests = render()
    assert not [s for s in find(manifests, "Service") if s["metadata"]["name"].endswith("-external")]
    pod = one(manifests, "StatefulSet", "sluice-broker")["spec"]["template"]["spec"]
    assert "priorityClassName" not in pod
    assert "initContainers" not in pod
    assert [c["name"] for c in pod["containers"]] == ["broker"]


def test_external_access_needs_a_domain() -> None:
    err = render_error(sets=["components.broker.externalAccess.enabled=true"])
    assert "domain" in err


NODE_PORT = [
    "components.broker.externalAccess.enabled=true",
    "components.broker.externalAccess.type=NodePort",
    "components.broker.externalAccess.nodePorts.grpc=31700",
    "components.broker.externalAccess.nodePorts.wire=31800",
]


def _kubernetes_expand(text: str, env: dict[str, str]) -> str:
    """What the kubelet does to a command or argument: `$(VAR)` becomes the value, `$$` a literal `$`."""
    return re.sub(r"\$\$|\$\((\w+)\)", lambda m: "$" if m.group(0) == "$$" else env[m.group(1)], text)


def test_node_port_access_advertises_each_brokers_own_node_ports(tmp_path: Path) -> None:
    """Each broker's Service gets node ports base + ordinal, and the pod's command (run here by a real
    /bin/sh, with a stand-in `sluice` that prints its arguments) advertises exactly those."""
    manifests = render(sets=NODE_PORT)
    assert validate_manifests({"node-port": manifests}) == []
    services = [s for s in find(manifests, "Service") if s["metadata"]["name"].endswith("-external")]
    for i, svc in enumerate(services):
        assert svc["spec"]["type"] == "NodePort"
        assert {p["name"]: p["nodePort"] for p in svc["spec"]["ports"]} == {
            "grpc": 31700 + i,
            "wire": 31800 + i,
        }
    container = one(manifests, "StatefulSet", "sluice-broker")["spec"]["template"]["spec"]["containers"][0]
    assert "--advertised-host=$(HOST_IP)" in container["args"]
    assert any(e["name"] == "HOST_IP" for e in container["env"])
    fake = tmp_path / "sluice"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    env = {
        "SLUICE_POD_INDEX": "2",
        "HOST_IP": "10.0.0.7",
        "POD_NAME": "sluice-broker-2",
        "POD_NAMESPACE": "ns",
    }
    argv = [_kubernetes_expand(a, env) for a in [*container["command"], *container["args"]]]
    out = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"},
    ).stdout.splitlines()
    assert out[0] == "broker"
    assert {"--advertised-host=10.0.0.7", "--advertised-port=31702", "--advertised-wire-port=31802"} <= set(
        out
    )


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("components.broker.externalAccess.type=ClusterIP", "type"),
        ("components.broker.zoneSpread=always", "zoneSpread"),
        ("components.dispatcher.extraVolumeMounts[0].name=x", "mountPath"),
        ("components.coordinator.priorityClassName[0]=x", "priorityClassName"),
    ],
)
def test_the_schema_rejects_malformed_values(setting: str, complaint: str) -> None:
    assert complaint in render_error(sets=[setting])
