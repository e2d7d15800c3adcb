"""Replication settings in the chart: the coordinator's default replication factor (3, checked against
the broker count) and each broker's rack read from its pod's zone label (docs/replication.md)."""

from __future__ import annotations

from tests.chart.chartlib import CHART, one, render, render_error
from tests.chart.test_manifests import container, env_of


def test_defaults_replicate_three_ways_and_read_the_zone_label() -> None:
    manifests = render()
    coordinator = container(one(manifests, "StatefulSet", "sluice-coordinator"))
    assert "--default-replication-factor=3" in coordinator["args"]
    broker = env_of(container(one(manifests, "StatefulSet", "sluice-broker")))
    assert broker["SLUICE_BROKER_RACK"] == {
        "fieldRef": {"fieldPath": "metadata.labels['topology.kubernetes.io/zone']"}
    }


def test_no_pod_label_sets_no_rack() -> None:
    manifests = render(sets=["components.broker.rack.podLabel="])
    assert "SLUICE_BROKER_RACK" not in env_of(container(one(manifests, "StatefulSet", "sluice-broker")))


def test_a_factor_above_the_broker_count_is_refused() -> None:
    err = render_error(sets=["components.broker.replicas=2"])
    assert "defaultReplicationFactor (3) is above components.broker.replicas (2)" in err
    single = render([CHART / "ci" / "values-single-broker.yaml"])
    coordinator = container(one(single, "StatefulSet", "sluice-coordinator"))
    assert "--default-replication-factor=1" in coordinator["args"]


def test_the_factor_is_a_positive_integer() -> None:
    err = render_error(sets=["components.coordinator.defaultReplicationFactor=0"])
    assert "defaultReplicationFactor" in err


def test_brokers_spread_across_nodes_by_default_and_affinity_replaces_it() -> None:
    def pod_affinity(sets: list[str]) -> dict[str, object] | None:
        sts = one(render(sets=sets), "StatefulSet", "sluice-broker")
        found: dict[str, object] | None = sts["spec"]["template"]["spec"].get("affinity")
        return found

    soft = pod_affinity([])
    assert soft is not None
    (term,) = soft["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]  # type: ignore[index]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    labels = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
    assert labels["app.kubernetes.io/component"] == "broker"
    hard = pod_affinity(["components.broker.antiAffinity=hard"])
    assert hard is not None
    assert "requiredDuringSchedulingIgnoredDuringExecution" in hard["podAntiAffinity"]  # type: ignore[operator]
    assert pod_affinity(["components.broker.antiAffinity=none"]) is None
    own = pod_affinity(["components.broker.affinity.nodeAffinity.x=y"])
    assert own == {"nodeAffinity": {"x": "y"}}
    # Other components keep their affinity as set (none by default).
    coordinator = one(render(), "StatefulSet", "sluice-coordinator")
    assert "affinity" not in coordinator["spec"]["template"]["spec"]
