"""What the rendered manifests must say for Sluice to run: identities, election, probes, security, wiring."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import tomllib
from typing import Any

import pytest

from tests.chart.chartlib import CHART, Manifest, find, one, render

CI = CHART / "ci"
SLUICE_WORKLOADS = {
    "sluice-broker": ("StatefulSet", 7601, 9601),
    "sluice-coordinator": ("StatefulSet", 7600, 9600),
    "sluice-offset-store": ("Deployment", 7602, 9602),
    "sluice-dispatcher": ("StatefulSet", 7603, 9603),
}
# Ports a workload has besides grpc and metrics: the wire port (plain-TCP data plane) of the broker
# and of the dispatcher; the coordinator and the offset store have none.
EXTRA_PORTS = {"sluice-broker": {"wire": 7611}, "sluice-dispatcher": {"wire": 7613}}


@pytest.fixture(scope="module")
def defaults() -> list[Manifest]:
    return render()


@pytest.fixture(scope="module")
def all_features() -> list[Manifest]:
    return render([CI / "values-all-features.yaml"])


def container(workload: Manifest) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    c: dict[str, Any] = containers[0]
    return c


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def test_broker_is_a_statefulset_with_a_volume_per_pod_and_a_stable_name(defaults: list[Manifest]) -> None:
    sts = one(defaults, "StatefulSet", "sluice-broker")
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["serviceName"] == "sluice-broker-headless"
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    c = container(sts)
    assert {"name": "data", "mountPath": "/data"} in c["volumeMounts"]
    args = c["args"]
    assert args[0] == "broker"
    assert "--data-dir=/data" in args
    assert "--broker-id=$(SLUICE_POD_INDEX)" in args
    assert "--coordinator=sluice-coordinator:7600" in args
    assert "--advertised-host=$(POD_NAME).sluice-broker-headless.$(POD_NAMESPACE).svc.cluster.local" in args
    assert "--flush=always" in args
    env = env_of(c)
    assert env["SLUICE_POD_INDEX"] == {
        "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}
    }
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}

    headless = one(defaults, "Service", "sluice-broker-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert one(defaults, "Service", "sluice-broker")["spec"]["type"] == "ClusterIP"


def service_ports(service: Manifest) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in service["spec"]["ports"]}


def policy_ports(rule: dict[str, Any]) -> list[int]:
    return [p["port"] for p in rule["ports"]]


def assert_broker_wire_port(m: list[Manifest], wire: int, grpc: int = 7601) -> None:
    """The wire port is exposed like the gRPC port: container, both Services, the flag, the policy."""
    sts = one(m, "StatefulSet", "sluice-broker")
    c = container(sts)
    ports = {p["name"]: p for p in c["ports"]}
    assert ports["wire"] == {"name": "wire", "containerPort": wire, "protocol": "TCP"}
    assert ports["grpc"]["containerPort"] == grpc
    # The broker's config field wire_port comes from the flag, as port and metrics_port do.
    assert f"--wire-port={wire}" in c["args"]
    assert [a for a in c["args"] if a.startswith("--wire-port")] == [f"--wire-port={wire}"]
    assert f"--port={grpc}" in c["args"]
    # Clients connect to the advertised host, the pod's headless DNS name, on both ports; the
    # headless Service that gives the pod that name lists the wire port as it lists gRPC.
    assert sts["spec"]["serviceName"] == "sluice-broker-headless"
    assert any(a.startswith("--advertised-host=$(POD_NAME).sluice-broker-headless.") for a in c["args"])
    for name in ("sluice-broker", "sluice-broker-headless"):
        svc = service_ports(one(m, "Service", name))
        assert svc["wire"] == {"name": "wire", "port": wire, "targetPort": "wire", "protocol": "TCP"}, name
        assert svc["grpc"]["port"] == grpc, name
    policy = one(m, "NetworkPolicy", "sluice-broker")
    grpc_rules = [r for r in policy["spec"]["ingress"] if grpc in policy_ports(r)]
    assert grpc_rules, "no rule admits the gRPC port"
    for rule in grpc_rules:
        # Whoever may reach the gRPC port may reach the wire port, from the same peers.
        assert policy_ports(rule) == [grpc, wire]
        assert all(p["protocol"] == "TCP" for p in rule["ports"])


def test_broker_exposes_the_wire_port_like_the_grpc_port() -> None:
    m = render(sets=["networkPolicy.enabled=true"])
    assert_broker_wire_port(m, 7611)
    (rule, metrics_rule) = one(m, "NetworkPolicy", "sluice-broker")["spec"]["ingress"]
    assert "from" not in rule, "allowExternal (the default) lets any pod reach gRPC and wire"
    assert policy_ports(metrics_rule) == [9601]


def assert_dispatcher_wire_port(m: list[Manifest], wire: int, grpc: int = 7603) -> None:
    """The wire port is exposed like the gRPC port: container, Service, the flag, the policy."""
    dep = one(m, "StatefulSet", "sluice-dispatcher")
    c = container(dep)
    ports = {p["name"]: p for p in c["ports"]}
    assert ports["wire"] == {"name": "wire", "containerPort": wire, "protocol": "TCP"}
    assert ports["grpc"]["containerPort"] == grpc
    # The dispatcher's config field wire_port comes from the flag, as port and metrics_port do.
    assert [a for a in c["args"] if a.startswith("--wire-port")] == [f"--wire-port={wire}"]
    assert f"--port={grpc}" in c["args"]
    # Consumers connect to the host the dispatcher advertises on both ports: this pod's own name under
    # the headless Service (a name a certificate can carry, unlike the pod IP), where both ports listen.
    assert "--host=0.0.0.0" in c["args"]
    assert [a for a in c["args"] if a.startswith("--advertised-host")] == [
        "--advertised-host=$(POD_NAME).sluice-dispatcher-headless.$(POD_NAMESPACE).svc.cluster.local"
    ]
    assert dep["spec"]["serviceName"] == "sluice-dispatcher-headless"
    svc = service_ports(one(m, "Service", "sluice-dispatcher"))
    assert svc["wire"] == {"name": "wire", "port": wire, "targetPort": "wire", "protocol": "TCP"}
    assert svc["grpc"]["port"] == grpc
    policy = one(m, "NetworkPolicy", "sluice-dispatcher")
    grpc_rules = [r for r in policy["spec"]["ingress"] if grpc in policy_ports(r)]
    assert grpc_rules, "no rule admits the gRPC port"
    for rule in grpc_rules:
        # Whoever may reach the gRPC port (push consumers) may reach the wire port, from the same peers.
        assert policy_ports(rule) == [grpc, wire]
        assert all(p["protocol"] == "TCP" for p in rule["ports"])


def test_dispatcher_exposes_the_wire_port_like_the_grpc_port() -> None:
    m = render(sets=["networkPolicy.enabled=true"])
    assert_dispatcher_wire_port(m, 7613)
    (rule, metrics_rule) = one(m, "NetworkPolicy", "sluice-dispatcher")["spec"]["ingress"]
    assert "from" not in rule, "allowExternal (the default) lets any pod reach gRPC and wire"
    assert policy_ports(metrics_rule) == [9603]


def test_the_broker_and_the_dispatcher_have_a_wire_port_and_nothing_else_does(
    all_features: list[Manifest],
) -> None:
    assert_broker_wire_port(all_features, 7611)
    assert_dispatcher_wire_port(all_features, 7613)
    for name in ("sluice-coordinator", "sluice-offset-store"):
        kind, _, _ = SLUICE_WORKLOADS[name]
        c = container(one(all_features, kind, name))
        assert "wire" not in {p["name"] for p in c["ports"]}, name
        assert not [a for a in c["args"] if a.startswith("--wire-port")], name
        assert "wire" not in service_ports(one(all_features, "Service", name)), name
        for rule in one(all_features, "NetworkPolicy", name)["spec"]["ingress"]:
            assert not {7611, 7613} & set(policy_ports(rule)), name


@pytest.mark.parametrize("wire", [7700, 17611])
def test_changing_the_wire_port_moves_the_port_and_the_broker_config_together(wire: int) -> None:
    m = render([CI / "values-all-features.yaml"], sets=[f"components.broker.wire.port={wire}"])
    assert_broker_wire_port(m, wire)
    assert_dispatcher_wire_port(m, 7613)
    assert not re.search(r"(?<!\d)7611(?!\d)", str(m)), "the default wire port is left somewhere"


@pytest.mark.parametrize("wire", [7700, 17613])
def test_changing_the_wire_port_moves_the_port_and_the_dispatcher_config_together(wire: int) -> None:
    m = render([CI / "values-all-features.yaml"], sets=[f"components.dispatcher.wire.port={wire}"])
    assert_dispatcher_wire_port(m, wire)
    assert_broker_wire_port(m, 7611)
    assert not re.search(r"(?<!\d)7613(?!\d)", str(m)), "the default wire port is left somewhere"


def test_coordinator_elects_a_leader_through_a_lease_with_lease_only_rbac(defaults: list[Manifest]) -> None:
    dep = one(defaults, "StatefulSet", "sluice-coordinator")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "sluice-coordinator"
    assert pod["automountServiceAccountToken"] is True
    env = env_of(container(dep))
    assert env["SLUICE_COORDINATOR_ELECTION"] == "kubernetes"
    assert env["SLUICE_COORDINATOR_LEASE_NAME"] == "sluice-coordinator"
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    args = container(dep)["args"]
    # The Redis URL (with its password) comes as the service's own env setting, never as a flag that
    # would put it on the command line.
    assert not [a for a in args if "redis" in a]
    assert env["SLUICE_COORDINATOR_REDIS_URL"] == {
        "secretKeyRef": {"name": "sluice-redis", "key": "redis-url"}
    }
    assert "--offset-store=sluice-offset-store:7602" in args
    # Its own name under the headless Service, not its pod IP: standbys forward to the leader there and
    # clients are sent there, over TLS verified against that name (the certificate's wildcard).
    assert (
        "--advertised-host=$(POD_NAME).sluice-coordinator-headless.$(POD_NAMESPACE).svc.cluster.local" in args
    )
    assert dep["spec"]["serviceName"] == "sluice-coordinator-headless"
    headless = one(defaults, "Service", "sluice-coordinator-headless")["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["publishNotReadyAddresses"] is True

    one(defaults, "ServiceAccount", "sluice-coordinator")
    role = one(defaults, "Role", "sluice-coordinator")
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "list", "watch", "create", "update", "patch"],
        }
    ]
    binding = one(defaults, "RoleBinding", "sluice-coordinator")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "sluice-coordinator",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "sluice-coordinator", "namespace": "sluice-test"}
    ]


def test_no_election_means_no_rbac_and_no_token() -> None:
    m = render([CI / "values-single-broker.yaml"])
    assert not find(m, "Role")
    assert not find(m, "RoleBinding")
    # No coordinator ServiceAccount; the others' own ones (no token, no RBAC) are always there.
    accounts = find(m, "ServiceAccount")
    names = {a["metadata"]["name"] for a in accounts}
    assert names == {"sluice-broker", "sluice-offset-store", "sluice-scheduler"}
    assert all(a["automountServiceAccountToken"] is False for a in accounts)
    dep = one(m, "StatefulSet", "sluice-coordinator")
    assert dep["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert "SLUICE_COORDINATOR_ELECTION" not in env_of(container(dep))


def test_only_the_coordinator_gets_a_service_account_token(defaults: list[Manifest]) -> None:
    for name, (kind, _, _) in SLUICE_WORKLOADS.items():
        pod = one(defaults, kind, name)["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is (name == "sluice-coordinator"), name


@pytest.mark.parametrize("name", sorted(SLUICE_WORKLOADS))
def test_every_service_has_grpc_health_probes_security_and_resources(
    defaults: list[Manifest], name: str
) -> None:
    kind, port, metrics = SLUICE_WORKLOADS[name]
    workload = one(defaults, kind, name)
    pod = workload["spec"]["template"]["spec"]
    c = container(workload)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"] == {"port": port}, probe
    extra = EXTRA_PORTS.get(name, {})
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"grpc": port, "metrics": metrics, **extra}
    assert all(p["protocol"] == "TCP" for p in c["ports"])
    assert f"--port={port}" in c["args"]
    assert f"--metrics-port={metrics}" in c["args"]
    assert "--host=0.0.0.0" in c["args"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert set(c["resources"]) == {"requests", "limits"}
    # The read-only root filesystem leaves /tmp (emptyDir) and, for brokers, /data writable.
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    # Graceful shutdown is the service's own SIGTERM handling: a grace period, no preStop hook.
    assert pod["terminationGracePeriodSeconds"] >= 30
    assert "lifecycle" not in c
    assert "command" not in c, "the image's ENTRYPOINT (sluice) runs; the chart passes args only"
    assert "checksum/config" in workload["spec"]["template"]["metadata"]["annotations"]


def test_checksum_changes_only_for_the_component_whose_config_changed(defaults: list[Manifest]) -> None:
    changed = render(sets=["components.broker.config.segment_bytes=1048576"])

    def checksum(m: list[Manifest], kind: str, name: str) -> str:
        value: str = one(m, kind, name)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return value

    assert checksum(changed, "StatefulSet", "sluice-broker") != checksum(
        defaults, "StatefulSet", "sluice-broker"
    )
    assert checksum(changed, "StatefulSet", "sluice-dispatcher") == checksum(
        defaults, "StatefulSet", "sluice-dispatcher"
    )
    config = one(changed, "ConfigMap", "sluice-broker")["data"]["broker.toml"]
    assert "segment_bytes = 1048576" in config


def test_config_maps_render_toml_the_services_read(all_features: list[Manifest]) -> None:
    broker = tomllib.loads(one(all_features, "ConfigMap", "sluice-broker")["data"]["broker.toml"])
    assert broker == {"segment_bytes": 268435456, "retention_age": "3d"}
    coordinator = tomllib.loads(
        one(all_features, "ConfigMap", "sluice-coordinator")["data"]["coordinator.toml"]
    )
    assert coordinator == {"broker_session_timeout": "20s"}


def test_every_service_selects_pods_and_every_pdb_matches_its_workload(all_features: list[Manifest]) -> None:
    pods = [
        w["spec"]["template"]["metadata"]["labels"]
        for w in all_features
        if w["kind"] in ("Deployment", "StatefulSet")
    ]
    for svc in find(all_features, "Service"):
        selector = svc["spec"]["selector"]
        assert any(selector.items() <= labels.items() for labels in pods), svc["metadata"]["name"]
    pdbs = find(all_features, "PodDisruptionBudget")
    assert {p["metadata"]["name"] for p in pdbs} == {
        "sluice-broker",
        "sluice-coordinator",
        "sluice-offset-store",
        "sluice-dispatcher",
        "sluice-scheduler",
        "sluice-redis",
    }
    for pdb in pdbs:
        selector = pdb["spec"]["selector"]["matchLabels"]
        assert sum(selector.items() <= labels.items() for labels in pods) == 1, pdb["metadata"]["name"]


def test_bundled_redis_uses_aof_a_pvc_and_a_password_from_a_secret(defaults: list[Manifest]) -> None:
    sts = one(defaults, "StatefulSet", "sluice-redis")
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    conf = one(defaults, "ConfigMap", "sluice-redis")["data"]["redis.conf"]
    assert "appendonly yes" in conf
    assert "appendfsync always" in conf
    assert "maxmemory-policy noeviction" in conf  # the services refuse any other policy
    assert "dir /data" in conf
    c = container(sts)
    assert c["args"][:3] == ["/etc/redis/redis.conf", "--requirepass", "$(REDIS_PASSWORD)"]
    secret = one(defaults, "Secret", "sluice-redis")
    # Sluice's ACL user's password (in the URL) and the default user's, which the services never get.
    assert set(secret["data"]) == {"redis-password", "admin-password", "redis-url"}
    for name, prefix in (("sluice-coordinator", "COORDINATOR"), ("sluice-offset-store", "OFFSET_STORE")):
        env = env_of(container(one(defaults, SLUICE_WORKLOADS[name][0], name)))
        assert env[f"SLUICE_{prefix}_REDIS_URL"] == {
            "secretKeyRef": {"name": "sluice-redis", "key": "redis-url"}
        }


def test_aof_toggle_turns_it_off() -> None:
    m = render(sets=["components.redis.appendOnly=false"])
    assert "appendonly no" in one(m, "ConfigMap", "sluice-redis")["data"]["redis.conf"]


def test_external_redis_from_an_existing_secret() -> None:
    m = render([CI / "values-external-redis.yaml"])
    assert not find(m, "StatefulSet", "sluice-redis")
    assert not find(m, "Secret")
    env = env_of(container(one(m, "Deployment", "sluice-offset-store")))
    assert env["SLUICE_OFFSET_STORE_REDIS_URL"] == {
        "secretKeyRef": {"name": "sluice-redis-credentials", "key": "url"}
    }


def test_external_redis_from_a_url_goes_into_a_secret() -> None:
    m = render([CI / "values-three-brokers.yaml"])
    secret = one(m, "Secret", "sluice-external-redis")
    assert base64.b64decode(secret["data"]["redis-url"]) == b"redis://redis.storage.svc.cluster.local:6379/0"
    env = env_of(container(one(m, "StatefulSet", "sluice-coordinator")))
    assert env["SLUICE_COORDINATOR_REDIS_URL"] == {
        "secretKeyRef": {"name": "sluice-external-redis", "key": "redis-url"}
    }
    assert not any("redis://" in str(w["spec"]) for w in find(m, "Deployment") + find(m, "StatefulSet")), (
        "the URL stays out of pod specs"
    )


def test_single_broker_without_persistence_uses_empty_dir() -> None:
    m = render([CI / "values-single-broker.yaml"])
    sts = one(m, "StatefulSet", "sluice-broker")
    assert sts["spec"]["replicas"] == 1
    assert "volumeClaimTemplates" not in sts["spec"]
    assert {"name": "data", "emptyDir": {}} in sts["spec"]["template"]["spec"]["volumes"]
    assert not find(m, "StatefulSet", "sluice-dispatcher")
    assert not find(m, "PodDisruptionBudget")
    scheduler = one(m, "StatefulSet", "sluice-scheduler")
    assert "volumeClaimTemplates" not in scheduler["spec"]


def test_dispatcher_hpa_owns_the_replica_count(all_features: list[Manifest]) -> None:
    dep = one(all_features, "StatefulSet", "sluice-dispatcher")
    assert "replicas" not in dep["spec"]
    hpa = one(all_features, "HorizontalPodAutoscaler", "sluice-dispatcher")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": "sluice-dispatcher",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu", "memory"]


def test_monitor_scrapes_the_metrics_port_of_the_client_services_only(all_features: list[Manifest]) -> None:
    monitor = one(all_features, "ServiceMonitor", "sluice")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    selector = monitor["spec"]["selector"]["matchLabels"]
    scraped = {
        s["metadata"]["name"]
        for s in find(all_features, "Service")
        if selector.items() <= s["metadata"]["labels"].items()
    }
    assert scraped == {
        "sluice-broker",
        "sluice-coordinator",
        "sluice-offset-store",
        "sluice-dispatcher",
        "sluice-scheduler",
    }


def test_pod_monitor_toggle() -> None:
    m = render([CI / "values-external-redis.yaml"])
    assert not find(m, "ServiceMonitor")
    pm = one(m, "PodMonitor", "sluice")
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_network_policies_keep_redis_private(all_features: list[Manifest]) -> None:
    policy = one(all_features, "NetworkPolicy", "sluice-redis")
    (rule,) = policy["spec"]["ingress"]
    components = {peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in rule["from"]}
    assert components == {"coordinator", "offset-store"}
    broker = one(all_features, "NetworkPolicy", "sluice-broker")
    grpc_rule = broker["spec"]["ingress"][0]
    assert grpc_rule["ports"] == [{"port": 7601, "protocol": "TCP"}, {"port": 7611, "protocol": "TCP"}]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}} in grpc_rule[
        "from"
    ]
    # Push consumers stream from the dispatcher's wire port: the same peers as its gRPC port.
    dispatcher = one(all_features, "NetworkPolicy", "sluice-dispatcher")
    consumer_rule = dispatcher["spec"]["ingress"][0]
    assert consumer_rule["ports"] == [{"port": 7603, "protocol": "TCP"}, {"port": 7613, "protocol": "TCP"}]
    assert consumer_rule["from"] == grpc_rule["from"]


def test_helm_test_pod_produces_and_consumes_with_a_group_and_a_subscription(
    defaults: list[Manifest],
) -> None:
    pod = one(defaults, "Pod", "sluice-test-produce-consume")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    c = pod["spec"]["containers"][0]
    assert c["image"] == "sluice:0.1.0"
    assert c["command"] == ["/bin/sh", "/scripts/produce-consume.sh"]
    env = env_of(c)
    assert env["SLUICE_BOOTSTRAP"] == "sluice-coordinator:7600"
    assert env["SLUICE_TEST_PUSH"] == "true"
    script = one(defaults, "ConfigMap", "sluice-test-produce-consume")["data"]["produce-consume.sh"]
    for step in ("sluice topic create", "sluice produce", "--group", "--subscription", "--type shared"):
        assert step in script, step
    sh = shutil.which("sh")
    assert sh is not None
    syntax = subprocess.run([sh, "-n"], input=script, capture_output=True, text=True, check=False)
    assert syntax.returncode == 0, syntax.stderr


def test_image_override_and_digest() -> None:
    m = render(sets=["image.digest=sha256:" + "a" * 64, "components.dispatcher.image.tag=canary"])
    assert container(one(m, "StatefulSet", "sluice-broker"))["image"] == "sluice@sha256:" + "a" * 64
    assert container(one(m, "StatefulSet", "sluice-dispatcher"))["image"] == "sluice:canary"
    assert container(one(m, "StatefulSet", "sluice-redis"))["image"] == "docker.io/library/redis:7.4"
