"""The chart's security: TLS certificates (cert-manager or existing Secrets), authentication, the cluster
token, probes under TLS, NetworkPolicies, and env names that are exactly the services' settings."""

from __future__ import annotations

import dataclasses
import posixpath
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from sluice.broker.config import ENV_PREFIX as BROKER_PREFIX
from sluice.broker.config import BrokerConfig
from sluice.coordinator.config import ENV_PREFIX as COORDINATOR_PREFIX
from sluice.coordinator.config import CoordinatorConfig
from sluice.dispatcher.config import ENV_PREFIX as DISPATCHER_PREFIX
from sluice.dispatcher.config import DispatcherConfig
from sluice.offsetstore.config import ENV_PREFIX as OFFSET_STORE_PREFIX
from sluice.offsetstore.config import OffsetStoreConfig
from sluice.security.settings import SecuritySettings
from sluice.server.config import load
from tests.chart.chartlib import CHART, Manifest, find, one, render, render_error, validate_manifests

SECURE = CHART / "ci" / "values-security.yaml"
CERT_MANAGER = "cert-manager.io/v1"
# Workload -> (kind, config class, env prefix): the chart must speak each service's own settings.
WORKLOADS: dict[str, tuple[str, type[Any], str]] = {
    "sluice-broker": ("StatefulSet", BrokerConfig, BROKER_PREFIX),
    "sluice-coordinator": ("StatefulSet", CoordinatorConfig, COORDINATOR_PREFIX),
    "sluice-offset-store": ("Deployment", OffsetStoreConfig, OFFSET_STORE_PREFIX),
    "sluice-dispatcher": ("StatefulSet", DispatcherConfig, DISPATCHER_PREFIX),
}
SECURITY_FIELDS = {f.name for f in dataclasses.fields(SecuritySettings)}


def pod_spec(m: list[Manifest], name: str) -> dict[str, Any]:
    spec: dict[str, Any] = one(m, WORKLOADS[name][0], name)["spec"]["template"]["spec"]
    return spec


def main_container_of(m: list[Manifest], kind: str, name: str) -> dict[str, Any]:
    c: dict[str, Any] = one(m, kind, name)["spec"]["template"]["spec"]["containers"][0]
    return c


def main_container(m: list[Manifest], name: str) -> dict[str, Any]:
    c: dict[str, Any] = pod_spec(m, name)["containers"][0]
    return c


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def volumes_of(m: list[Manifest], name: str) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod_spec(m, name)["volumes"]}


def mounts_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in c["volumeMounts"]}


@pytest.fixture(scope="module")
def defaults() -> list[Manifest]:
    return render()


@pytest.fixture(scope="module")
def secure() -> list[Manifest]:
    return render([SECURE])


# ---- env names: exactly the services' settings -------------------------------------------------------


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_sluice_env_the_chart_sets_is_a_setting_of_that_service(
    secure: list[Manifest], name: str
) -> None:
    """A renamed or removed setting makes this fail: the service would silently ignore the chart's env."""
    _kind, config_class, prefix = WORKLOADS[name]
    fields = {f.name for f in dataclasses.fields(config_class)}
    env = env_of(main_container(secure, name))
    ours = {k for k in env if k.startswith("SLUICE_") and k not in ("SLUICE_POD_INDEX",)}
    assert ours, "no settings at all"
    for key in ours:
        assert key.startswith(prefix), f"{key} is not a {config_class.__name__} setting (prefix {prefix})"
        assert key.removeprefix(prefix).lower() in fields, f"{key}: {config_class.__name__} has no such field"
    security = {k.removeprefix(prefix).lower() for k in ours} & SECURITY_FIELDS
    assert {
        "tls_cert",
        "tls_key",
        "tls_ca",
        "tls_client_auth",
        "auth_mechanisms",
        "cluster_token_file",
        "jwt_jwks_ca_file",
        "jwt_jwks_token_file",
        "jwt_token_review",
        "tls_metrics",
    } <= security


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_the_services_own_loader_accepts_every_value_the_chart_sets(
    secure: list[Manifest], name: str
) -> None:
    _kind, config_class, prefix = WORKLOADS[name]
    env = {k: v for k, v in env_of(main_container(secure, name)).items() if isinstance(v, str)}
    if f"{prefix}REDIS_URL" in env_of(main_container(secure, name)):
        env[f"{prefix}REDIS_URL"] = "redis+sentinel://sluice:pw@h:26379/sluice/0?sentinel_auth=yes"
    if "coordinator" in {f.name for f in dataclasses.fields(config_class)}:
        env[f"{prefix}COORDINATOR"] = "sluice-coordinator:7600"  # a flag in the pod; required
    config = load(config_class, prefix, env=env)
    assert str(config.tls_cert) == "/var/run/secrets/sluice/tls/tls.crt"
    assert config.tls_client_auth == "request"
    assert config.auth_mechanisms == "scram,jwt,mtls"
    assert config.allow_anonymous is False
    assert config.authorization == "acl"
    assert config.super_users == "admin"
    assert config.jwt_audience == "sluice"
    assert config.jwt_jwks_url == "https://kubernetes.default.svc/openid/v1/jwks"
    assert str(config.jwt_jwks_ca_file) == "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    assert str(config.jwt_jwks_token_file) == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert config.jwt_jwks_refetch_interval == timedelta(seconds=10)
    assert config.jwt_jwks_max_age == timedelta(minutes=10)
    assert config.jwt_token_review is True
    assert config.jwt_token_review_interval == timedelta(minutes=1)
    assert config.tls_metrics is True


# ---- TLS --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_plaintext_by_default_no_certificates_no_security_env(defaults: list[Manifest], name: str) -> None:
    c = main_container(defaults, name)
    assert not [k for k in env_of(c) if "_TLS_" in k or "_AUTH" in k or "CLUSTER_TOKEN" in k]
    assert "tls" not in volumes_of(defaults, name)
    assert c["readinessProbe"]["grpc"] == {"port": c["ports"][0]["containerPort"]}
    assert not find(defaults, "Certificate")
    assert not find(defaults, "Secret", "sluice-cluster-token")


def _check_tls_wiring(m: list[Manifest], name: str, secret: str) -> None:
    """The env points into the mount, the mount is read-only, the volume is the expected Secret."""
    _kind, _cls, prefix = WORKLOADS[name]
    c = main_container(m, name)
    env = env_of(c)
    mount = mounts_of(c)["tls"]
    assert mount["readOnly"] is True
    assert "subPath" not in mount, "a subPath mount never sees a renewed certificate"
    for key, file in (("TLS_CERT", "tls.crt"), ("TLS_KEY", "tls.key"), ("TLS_CA", "ca.crt")):
        assert env[prefix + key] == posixpath.join(mount["mountPath"], file), key
    volume = volumes_of(m, name)["tls"]["secret"]
    assert volume["secretName"] == secret
    assert {i["key"] for i in volume["items"]} == {"tls.crt", "tls.key", "ca.crt"}
    assert volume["defaultMode"] == 0o440, "readable by the pod's group (fsGroup), nobody else"


def test_cert_manager_issues_a_certificate_per_component_from_a_private_ca() -> None:
    m = render(sets=["tls.enabled=true"], api_versions=[CERT_MANAGER])
    certs = {c["metadata"]["name"]: c for c in find(m, "Certificate")}
    assert set(certs) == {"sluice-ca", "sluice-scheduler", *WORKLOADS}
    assert certs["sluice-ca"]["spec"]["isCA"] is True
    issuers = {i["metadata"]["name"]: i["spec"] for i in find(m, "Issuer")}
    assert issuers == {
        "sluice-selfsigned": {"selfSigned": {}},
        "sluice-ca": {"ca": {"secretName": "sluice-ca"}},
    }
    for name in WORKLOADS:
        spec = certs[name]["spec"]
        assert spec["issuerRef"] == {"name": "sluice-ca", "kind": "Issuer", "group": "cert-manager.io"}
        assert spec["secretName"] == f"{name}-tls"
        # The names the services dial each other by (the flags use the short Service name).
        assert {name, f"{name}.sluice-test.svc", f"{name}.sluice-test.svc.cluster.local"} <= set(
            spec["dnsNames"]
        )
        assert {"server auth", "client auth"} <= set(spec["usages"])
        _check_tls_wiring(m, name, f"{name}-tls")
    # Brokers are dialled at the pod names they advertise under the headless Service.
    assert (
        "*.sluice-broker-headless.sluice-test.svc.cluster.local" in certs["sluice-broker"]["spec"]["dnsNames"]
    )
    assert not validate_manifests({"cert-manager": m})


def _covers(dns_names: list[str], host: str) -> bool:
    """TLS hostname matching as the clients do it: exact, or a wildcard standing for one left-most label."""
    for name in dns_names:
        if name == host:
            return True
        if name.startswith("*.") and "." in host and host.split(".", 1)[1] == name[2:]:
            return True
    return False


@pytest.mark.parametrize(("release", "fullname"), [("sluice", "sluice"), ("prod", "prod-sluice")])
def test_every_name_a_peer_or_client_dials_is_on_that_components_certificate(
    release: str, fullname: str
) -> None:
    """The advertised hosts (brokers, coordinators, dispatchers: their pod names under the headless
    Services, never a pod IP), the addresses the services are given for each other (--coordinator,
    --offset-store) and the clients' bootstrap all verify against the certificate of the pod they reach."""
    m = render(sets=["tls.enabled=true"], api_versions=[CERT_MANAGER], release=release)
    certs = {c["metadata"]["name"]: c["spec"].get("dnsNames", []) for c in find(m, "Certificate")}
    dialled: list[tuple[str, str]] = []
    advertising: set[str] = set()
    for name, (kind, _cls, _prefix) in WORKLOADS.items():
        workload = name.replace("sluice", fullname, 1)
        for arg in main_container_of(m, kind, workload)["args"]:
            flag, _, value = arg.partition("=")
            if flag == "--advertised-host":
                assert "POD_IP" not in value, f"{workload}: no certificate issued ahead can name a pod IP"
                pod = value.replace("$(POD_NAME)", f"{workload}-0").replace("$(POD_NAMESPACE)", "sluice-test")
                dialled.append((workload, pod))
                advertising.add(workload)
            elif flag in ("--coordinator", "--offset-store"):
                target = value.rsplit(":", 1)[0]
                dialled.append((target, target))
    assert advertising == {f"{fullname}-{c}" for c in ("broker", "coordinator", "dispatcher")}
    test_pod = one(m, "Pod", f"{fullname}-test-produce-consume")["spec"]["containers"][0]
    dialled.append((f"{fullname}-coordinator", env_of(test_pod)["SLUICE_BOOTSTRAP"].rsplit(":", 1)[0]))
    assert {w for w, _ in dialled} == {n.replace("sluice", fullname, 1) for n in WORKLOADS}
    for workload, host in dialled:
        assert _covers(certs[workload], host), (workload, host, certs[workload])
    # The pod names resolve: each advertising workload is a StatefulSet governed by its headless Service.
    for workload in advertising:
        assert one(m, "StatefulSet", workload)["spec"]["serviceName"] == f"{workload}-headless"
        assert one(m, "Service", f"{workload}-headless")["spec"]["clusterIP"] == "None"


def test_an_issuer_of_yours_signs_and_the_chart_makes_no_ca() -> None:
    m = render(
        sets=[
            "tls.enabled=true",
            "tls.certManager.issuerRef.name=corp",
            "tls.certManager.issuerRef.kind=ClusterIssuer",
        ],
        api_versions=[CERT_MANAGER],
    )
    assert not find(m, "Issuer")
    assert {c["metadata"]["name"] for c in find(m, "Certificate")} == {"sluice-scheduler", *WORKLOADS}
    for cert in find(m, "Certificate"):
        assert cert["spec"]["issuerRef"] == {
            "name": "corp",
            "kind": "ClusterIssuer",
            "group": "cert-manager.io",
        }


def test_without_cert_manager_tls_needs_secrets_and_says_so() -> None:
    err = render_error(sets=["tls.enabled=true"])
    assert "tls.enabled: no certificate for broker, coordinator, offsetStore, dispatcher, scheduler" in err
    assert "cert-manager" in err
    forced = render(sets=["tls.enabled=true", "tls.certManager.force=true"])
    assert len(find(forced, "Certificate")) == 6


def test_existing_secrets_replace_cert_manager_shared_or_per_component() -> None:
    m = render(
        sets=[
            "tls.enabled=true",
            "tls.existingSecret=sluice-certs",
            "tls.componentSecrets.broker=broker-certs",
        ],
        api_versions=[CERT_MANAGER],
    )
    assert not find(m, "Certificate")
    assert not find(m, "Issuer")
    for name in WORKLOADS:
        _check_tls_wiring(m, name, "broker-certs" if name == "sluice-broker" else "sluice-certs")
    # Only the uncovered components need cert-manager.
    partial = render(
        sets=["tls.enabled=true", "tls.componentSecrets.broker=broker-certs"], api_versions=[CERT_MANAGER]
    )
    assert "sluice-broker" not in {c["metadata"]["name"] for c in find(partial, "Certificate")}
    _check_tls_wiring(partial, "sluice-broker", "broker-certs")


@pytest.mark.parametrize(
    ("sets", "check"),
    [
        ([], {"httpGet": {"path": "/healthz", "port": "metrics", "scheme": "HTTP"}}),
        (["tls.metrics=true"], {"httpGet": {"path": "/healthz", "port": "metrics", "scheme": "HTTPS"}}),
        (["tls.probes=tcpSocket"], {"tcpSocket": {"port": "grpc"}}),
    ],
)
def test_probes_under_tls_ask_healthz_on_the_metrics_port_never_plaintext_grpc(
    sets: list[str], check: dict[str, Any]
) -> None:
    """The default asks the service's own health (/healthz: 503 once NOT_SERVING), over HTTPS when the
    metrics port serves TLS; a plaintext gRPC probe at a TLS port would fail every time."""
    m = render(sets=["tls.enabled=true", "tls.existingSecret=s", *sets])
    for name, (_kind, _cls, prefix) in WORKLOADS.items():
        c = main_container(m, name)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            kind = next(iter(check))
            assert {kind: c[probe][kind]} == check, (name, probe)
            assert {"grpc", "tcpSocket", "httpGet"} & set(c[probe]) == {kind}
        # HTTPS probes exactly when the service serves its metrics port with TLS.
        assert (env_of(c).get(prefix + "TLS_METRICS") == "true") is ("tls.metrics=true" in sets), name
        assert "metrics" in {port["name"] for port in c["ports"]}


@pytest.mark.parametrize("setting", ["tls.probes=grpc", "tls.healthPort=7699", "tls.probePath=/x"])
def test_probe_modes_the_services_cannot_answer_are_gone(setting: str) -> None:
    """No service has a plaintext health-only gRPC port, and /healthz is the only health path."""
    assert "don't meet the specifications of the schema" in render_error(sets=["tls.enabled=true", setting])


# ---- authentication and the cluster token -----------------------------------------------------------


def test_auth_turns_on_every_service_with_the_cluster_token_mounted(secure: list[Manifest]) -> None:
    token = one(secure, "Secret", "sluice-cluster-token")
    assert set(token["data"]) == {"token"}
    for name, (_kind, _cls, prefix) in WORKLOADS.items():
        c = main_container(secure, name)
        env = env_of(c)
        mount = mounts_of(c)["cluster-token"]
        assert mount["readOnly"] is True
        assert env[prefix + "CLUSTER_TOKEN_FILE"] == posixpath.join(mount["mountPath"], "token")
        volume = volumes_of(secure, name)["cluster-token"]["secret"]
        assert volume["secretName"] == "sluice-cluster-token"
        assert env[prefix + "ALLOW_ANONYMOUS"] == "false"
        assert env[prefix + "AUTHORIZATION"] == "acl"
        assert env[prefix + "JWT_ISSUER"] == "https://kubernetes.default.svc.cluster.local"
        # Fetching the API server's JWKS takes a ServiceAccount token.
        assert pod_spec(secure, name)["automountServiceAccountToken"] is True, name


SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def test_the_api_servers_jwks_is_fetched_with_the_pods_own_ca_and_rotated_token(
    secure: list[Manifest],
) -> None:
    for name, (_kind, _cls, prefix) in WORKLOADS.items():
        env = env_of(main_container(secure, name))
        assert env[prefix + "JWT_JWKS_CA_FILE"] == f"{SA_DIR}/ca.crt", name
        # A path, re-read at every fetch: the kubelet rotates the mounted token.
        assert env[prefix + "JWT_JWKS_TOKEN_FILE"] == f"{SA_DIR}/token", name
        assert env[prefix + "JWT_JWKS_REFETCH_INTERVAL"] == "10s"
        assert env[prefix + "JWT_JWKS_MAX_AGE"] == "10m"


def test_an_external_jwks_gets_no_cluster_ca_and_no_service_account_token() -> None:
    m = render(
        sets=[
            "auth.enabled=true",
            "auth.mechanisms={jwt}",
            "auth.jwt.jwksUrl=https://idp.example/jwks",
            "auth.jwt.kubernetesCA=false",
            "auth.jwt.jwksRefetchInterval=30s",
        ]
    )
    for name, (_kind, _cls, prefix) in WORKLOADS.items():
        env = env_of(main_container(m, name))
        assert env[prefix + "JWT_JWKS_URL"] == "https://idp.example/jwks"
        assert env[prefix + "JWT_JWKS_REFETCH_INTERVAL"] == "30s"
        assert not {
            prefix + "JWT_JWKS_CA_FILE",
            prefix + "JWT_JWKS_TOKEN_FILE",
            prefix + "JWT_TOKEN_REVIEW",
        } & set(env)
        assert pod_spec(m, name)["automountServiceAccountToken"] is (name == "sluice-coordinator"), name
    assert not find(m, "ClusterRoleBinding")


def test_token_review_is_off_by_default() -> None:
    m = render(sets=["auth.enabled=true"])
    assert not find(m, "ClusterRoleBinding")
    for name, (_kind, _cls, prefix) in WORKLOADS.items():
        assert prefix + "JWT_TOKEN_REVIEW" not in env_of(main_container(m, name))


def test_token_review_binds_auth_delegator_to_exactly_the_components_service_accounts(
    secure: list[Manifest],
) -> None:
    """Every component authenticates clients, so each reviews tokens as its own ServiceAccount; none of
    them is the namespace's default one, which every other pod there may run as."""
    [binding] = find(secure, "ClusterRoleBinding")
    assert binding["metadata"]["name"] == "sluice-test-sluice-token-review", (
        "cluster-scoped: carries the namespace"
    )
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "system:auth-delegator",
    }
    subjects = {(s["kind"], s["name"], s["namespace"]) for s in binding["subjects"]}
    accounts = {pod_spec(secure, name)["serviceAccountName"] for name in WORKLOADS}
    assert subjects == {("ServiceAccount", a, "sluice-test") for a in accounts}
    assert "default" not in accounts
    assert len(accounts) == len(WORKLOADS), "one ServiceAccount per component"
    created = {a["metadata"]["name"] for a in find(secure, "ServiceAccount")}
    assert accounts <= created
    for name, (_kind, _cls, prefix) in WORKLOADS.items():
        env = env_of(main_container(secure, name))
        assert env[prefix + "JWT_TOKEN_REVIEW"] == "true"
        assert env[prefix + "JWT_TOKEN_REVIEW_INTERVAL"] == "1m"
        assert pod_spec(secure, name)["automountServiceAccountToken"] is True, "the in-cluster client's token"


def test_token_review_without_the_kubernetes_jwks_still_mounts_the_token_and_rbac_can_be_yours() -> None:
    m = render(
        sets=[
            "auth.enabled=true",
            "auth.jwt.kubernetesCA=false",
            "auth.jwt.tokenReview.enabled=true",
            "auth.jwt.tokenReview.rbac.create=false",
        ]
    )
    assert not find(m, "ClusterRoleBinding")
    for name in WORKLOADS:
        assert pod_spec(m, name)["automountServiceAccountToken"] is True, name


def test_scram_always_gets_the_cluster_token_the_services_require() -> None:
    """The services refuse --auth-mechanisms scram without --cluster-token-file: the chart always sets it."""
    for sets in ([], ["auth.clusterToken.existingSecret=mine"]):
        m = render(sets=["auth.enabled=true", "auth.mechanisms={scram}", *sets])
        for name, (_kind, _cls, prefix) in WORKLOADS.items():
            c = main_container(m, name)
            assert env_of(c)[prefix + "CLUSTER_TOKEN_FILE"].startswith(
                mounts_of(c)["cluster-token"]["mountPath"]
            )


def test_an_existing_cluster_token_secret_is_used_and_none_is_generated() -> None:
    m = render(sets=["auth.enabled=true", "auth.clusterToken.existingSecret=mine", "auth.mechanisms={scram}"])
    assert not find(m, "Secret", "sluice-cluster-token")
    for name in WORKLOADS:
        assert volumes_of(m, name)["cluster-token"]["secret"]["secretName"] == "mine"
        assert not [k for k in env_of(main_container(m, name)) if "_JWT_" in k]
        # SCRAM alone needs no API token; only the coordinator's election does.
        assert pod_spec(m, name)["automountServiceAccountToken"] is (name == "sluice-coordinator")


def test_the_generated_cluster_token_is_random_per_install() -> None:
    first = one(render(sets=["auth.enabled=true"]), "Secret", "sluice-cluster-token")["data"]["token"]
    second = one(render(sets=["auth.enabled=true"]), "Secret", "sluice-cluster-token")["data"]["token"]
    assert first != second, "helm template cannot look up the old one: each fresh install gets its own"


@pytest.mark.parametrize(
    ("sets", "complaint"),
    [
        (["auth.enabled=true", "auth.mechanisms={mtls}"], "auth.mechanisms has mtls: it needs tls.enabled"),
        (
            ["auth.enabled=true", "auth.mechanisms={mtls}", "tls.enabled=true", "tls.existingSecret=s"],
            "auth.mechanisms has mtls but tls.clientAuth is none",
        ),
        (
            ["auth.enabled=true", "auth.mechanisms={scram}", "auth.jwt.tokenReview.enabled=true"],
            "TokenReview",
        ),
        (
            [
                "auth.enabled=true",
                "auth.jwt.tokenReview.enabled=true",
                "components.coordinator.serviceAccount.create=false",
            ],
            "default ServiceAccount",
        ),
        (["tls.metrics=true"], "tls.metrics is true but tls.enabled is false"),
        (
            ["tls.enabled=true", "tls.existingSecret=s", "tls.metrics=true", "monitoring.enabled=true"],
            "the chart's monitor scrapes plain HTTP",
        ),
        (["tls.clientAuth=require"], "client certificates need TLS"),
        (["auth.enabled=true", "auth.jwt.jwksUrl="], "set auth.jwt.jwksUrl"),
    ],
)
def test_contradictory_security_values_are_refused(sets: list[str], complaint: str) -> None:
    assert complaint in render_error(sets=sets)


def test_auth_without_a_mechanism_is_refused(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("auth:\n  enabled: true\n  mechanisms: []\n")
    assert "auth.enabled needs at least one of auth.mechanisms" in render_error([values])


@pytest.mark.parametrize(
    "setting",
    [
        "tls.clientAuth=maybe",
        "auth.mechanisms={kerberos}",
        "auth.authorization=rbac",
        "tls.probes=exec",
        "auth.jwt.jwksUrl=http://x",
    ],
)
def test_the_schema_refuses_unknown_security_choices(setting: str) -> None:
    assert "don't meet the specifications of the schema" in render_error(sets=[setting])


def test_the_helm_test_pod_authenticates_with_a_sluice_only_token_and_trusts_the_ca(
    secure: list[Manifest],
) -> None:
    pod = one(secure, "Pod", "sluice-test-produce-consume")["spec"]
    assert pod["serviceAccountName"] == "sluice-test-produce-consume"
    one(secure, "ServiceAccount", "sluice-test-produce-consume")
    assert pod["automountServiceAccountToken"] is False, "no API token, only the audience-bound one"
    volumes = {v["name"]: v for v in pod["volumes"]}
    [source] = volumes["token"]["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == "sluice"
    assert volumes["ca"]["secret"] == {
        "secretName": "sluice-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    env = env_of(pod["containers"][0])
    assert env["SLUICE_TLS_CA"] == "/var/run/secrets/sluice/ca/ca.crt"
    # The file, not its content: the SDK re-reads it when the kubelet rotates it (SLUICE_TOKEN_FILE).
    token_mount = {v["name"]: v["mountPath"] for v in pod["containers"][0]["volumeMounts"]}["token"]
    assert env["SLUICE_TOKEN_FILE"] == posixpath.join(token_mount, source["serviceAccountToken"]["path"])
    assert "SLUICE_TOKEN" not in env, "a token in the env would win over the file and never be renewed"
    script = one(secure, "ConfigMap", "sluice-test-produce-consume")["data"]["produce-consume.sh"]
    assert "SLUICE_TOKEN" not in script
    # Without JWT there is no token at all.
    plain = one(
        render(sets=["auth.enabled=true", "auth.mechanisms={scram}"]), "Pod", "sluice-test-produce-consume"
    )
    assert "SLUICE_TOKEN_FILE" not in env_of(plain["spec"]["containers"][0])


@pytest.mark.parametrize(
    ("sets", "ca_secret"),
    [
        ([], "sluice-ca"),
        (["tls.certManager.issuerRef.name=corp"], "sluice-coordinator-tls"),
        (["tls.existingSecret=shared"], "shared"),
        (["tls.componentSecrets.coordinator=coord"], "coord"),
    ],
)
def test_clients_are_pointed_at_the_secret_that_holds_the_ca(sets: list[str], ca_secret: str) -> None:
    m = render(sets=["tls.enabled=true", *sets], api_versions=[CERT_MANAGER])
    pod = one(m, "Pod", "sluice-test-produce-consume")["spec"]
    [ca] = [v for v in pod["volumes"] if v["name"] == "ca"]
    assert ca["secret"]["secretName"] == ca_secret
    issued = {c["spec"]["secretName"] for c in find(m, "Certificate")}
    if not sets or "issuerRef" in sets[0]:
        assert ca_secret in issued, "the chart's own CA or a certificate it has issued"


# ---- NetworkPolicy ----------------------------------------------------------------------------------


def _component(peer: dict[str, Any]) -> str | None:
    labels: dict[str, str] = peer.get("podSelector", {}).get("matchLabels", {})
    return labels.get("app.kubernetes.io/component")


def test_network_policies_are_on_by_default_and_redis_admits_only_sluice(defaults: list[Manifest]) -> None:
    names = {p["metadata"]["name"] for p in find(defaults, "NetworkPolicy")}
    assert names == {*WORKLOADS, "sluice-scheduler", "sluice-redis"}
    [rule] = one(defaults, "NetworkPolicy", "sluice-redis")["spec"]["ingress"]
    assert sorted(_component(p) or "" for p in rule["from"]) == ["coordinator", "offset-store"]
    for peer in rule["from"]:
        assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "sluice"
        assert "namespaceSelector" not in peer, "this release's pods, in its own namespace only"


def test_network_policies_can_be_turned_off() -> None:
    assert not find(render(sets=["networkPolicy.enabled=false"]), "NetworkPolicy")


def test_closed_policies_admit_the_release_and_the_named_clients_only(secure: list[Manifest]) -> None:
    release = {
        "podSelector": {
            "matchLabels": {"app.kubernetes.io/name": "sluice", "app.kubernetes.io/instance": "sluice"}
        }
    }
    spark = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "spark"}}}
    for name in WORKLOADS:
        client_rule = one(secure, "NetworkPolicy", name)["spec"]["ingress"][0]
        assert client_rule["from"] == [release, spark], name
    [rule] = one(secure, "NetworkPolicy", "sluice-redis")["spec"]["ingress"]
    assert {p["port"] for p in rule["ports"]} == {6379, 26379}
    assert sorted(_component(p) or "" for p in rule["from"]) == ["coordinator", "offset-store", "redis"]


# ---- every variant is valid Kubernetes --------------------------------------------------------------


def test_every_security_variant_passes_kubernetes_validate_strict(secure: list[Manifest]) -> None:
    variants = {
        "secure": secure,
        "tls-cert-manager": render(sets=["tls.enabled=true"], api_versions=[CERT_MANAGER]),
        "tls-existing": render(sets=["tls.enabled=true", "tls.existingSecret=s", "tls.probes=tcpSocket"]),
        "tls-metrics": render(sets=["tls.enabled=true", "tls.existingSecret=s", "tls.metrics=true"]),
        "jwt-external-jwks": render(
            sets=[
                "auth.enabled=true",
                "auth.mechanisms={jwt}",
                "auth.jwt.jwksUrl=https://idp.example/jwks",
                "auth.jwt.kubernetesCA=false",
            ]
        ),
        "token-review-single": render(
            [CHART / "ci" / "values-single-broker.yaml"],
            sets=[
                "auth.enabled=true",
                "auth.jwt.tokenReview.enabled=true",
                "components.coordinator.serviceAccount.create=true",
            ],
        ),
        "auth-only": render(sets=["auth.enabled=true", "auth.superUsers={admin,ops}"]),
        "no-policies": render(sets=["networkPolicy.enabled=false", "auth.enabled=true"]),
    }
    problems = validate_manifests(variants)
    assert not problems, "\n".join(str(p) for p in problems)
    kinds = {m["kind"] for ms in variants.values() for m in ms}
    assert {"Certificate", "Issuer", "NetworkPolicy", "ServiceAccount", "ClusterRoleBinding"} <= kinds
