"""The delayed-delivery scheduler in the chart (docs/delayed-delivery.md, "Kubernetes"): one pod of a
StatefulSet, its metrics port scraped and probed, a client of the cluster with the chart's TLS and token."""

from __future__ import annotations

from typing import Any

from tests.chart.chartlib import CHART, Manifest, find, one, render, validate_manifests

CI = CHART / "ci"
NAME = "sluice-scheduler"


def _pod(m: list[Manifest]) -> dict[str, Any]:
    spec: dict[str, Any] = one(m, "StatefulSet", NAME)["spec"]["template"]["spec"]
    return spec


def _env(m: list[Manifest]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in _pod(m)["containers"][0].get("env", [])}


def test_one_pod_with_its_index_on_a_claim_probed_on_metrics() -> None:
    m = render()
    sts = one(m, "StatefulSet", NAME)
    assert sts["spec"]["replicas"] == 1
    # A StatefulSet never runs a pod's replacement beside it: two schedulers would both deliver.
    assert sts["spec"]["podManagementPolicy"] == "OrderedReady"
    assert [c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]] == ["data"]
    (c,) = _pod(m)["containers"]
    assert c["args"][:3] == [
        "scheduler",
        "--coordinator=sluice-coordinator:7600",
        "--data-dir=/data/scheduler",
    ]
    assert "--max-delay=7d" in c["args"]
    assert "--metrics-port=9604" in c["args"]
    assert c["ports"] == [{"name": "metrics", "containerPort": 9604, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTP"}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["resources"]["limits"]["memory"] == "1Gi"
    assert {"name": "data", "mountPath": "/data"} in c["volumeMounts"]
    assert _pod(m)["automountServiceAccountToken"] is False
    assert one(m, "PodDisruptionBudget", NAME)["spec"]["maxUnavailable"] == 1
    svc = one(m, "Service", NAME)
    assert svc["metadata"]["labels"]["sluice.dev/scrape"] == "true"
    assert [p["name"] for p in svc["spec"]["ports"]] == ["metrics"]
    (rule,) = one(m, "NetworkPolicy", NAME)["spec"]["ingress"]
    assert rule["ports"] == [{"port": 9604, "protocol": "TCP"}]
    assert not validate_manifests({"defaults": m})


def test_emptydir_without_persistence_and_off_when_disabled() -> None:
    m = render(sets=["components.scheduler.persistence.enabled=false"])
    sts = one(m, "StatefulSet", NAME)
    assert "volumeClaimTemplates" not in sts["spec"]
    assert {"name": "data", "emptyDir": {}} in _pod(m)["volumes"]
    off = render(sets=["components.scheduler.enabled=false"])
    assert not [x for x in off if x["metadata"]["name"] == NAME]


def test_security_wiring_is_a_clients(tmp_path: Any) -> None:
    m = render([CI / "values-security.yaml"])
    env = _env(m)
    tls = "/var/run/secrets/sluice/tls"
    assert env["SLUICE_TLS_CA"] == f"{tls}/ca.crt"
    assert env["SLUICE_TOKEN_FILE"] == "/var/run/secrets/sluice/cluster/token"
    mounts = {v["name"]: v["mountPath"] for v in _pod(m)["containers"][0]["volumeMounts"]}
    assert mounts["tls"] == tls
    assert mounts["cluster-token"] == "/var/run/secrets/sluice/cluster"
    volumes = {v["name"]: v for v in _pod(m)["volumes"]}
    assert volumes["tls"]["secret"]["secretName"]
    assert volumes["cluster-token"]["secret"]["items"] == [{"key": "token", "path": "token"}]
    # The client certificate only where the services ask for one.
    mtls = render([CI / "values-security.yaml"], sets=["tls.clientAuth=require"])
    assert _env(mtls)["SLUICE_TLS_CERT"] == f"{tls}/tls.crt"
    plain = render()
    assert not {"SLUICE_TLS_CA", "SLUICE_TOKEN_FILE"} & set(_env(plain))
    assert not find(plain, "Certificate")
    assert not validate_manifests({"security": m})
