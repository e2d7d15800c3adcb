"""The chart lints, renders over the ci/values-*.yaml matrix, and every manifest is valid Kubernetes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.chartlib import (
    CHART,
    CI_VALUES,
    KUBE_VERSIONS,
    Manifest,
    helm,
    render,
    validate_manifests,
)

MATRIX = {p.stem.removeprefix("values-"): p for p in CI_VALUES}


def test_the_matrix_covers_the_required_cases() -> None:
    assert {"defaults", "all-features", "external-redis", "single-broker", "three-brokers"} <= set(MATRIX)


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.stem)
def test_helm_lint_strict(values: Path) -> None:
    out = helm("lint", "--strict", str(CHART), "-f", str(values)).stdout
    assert "0 chart(s) failed" in out


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Manifest]]:
    return {name: render([path]) for name, path in MATRIX.items()}


def test_every_manifest_passes_kubernetes_validate_strict(rendered: dict[str, list[Manifest]]) -> None:
    assert len(KUBE_VERSIONS) >= 2
    problems = validate_manifests(rendered)
    assert not problems, "\n".join(str(p) for p in problems)


def test_the_matrix_renders_the_crd_kinds_it_validates(rendered: dict[str, list[Manifest]]) -> None:
    kinds = {m["kind"] for m in rendered["all-features"]} | {m["kind"] for m in rendered["external-redis"]}
    assert {"ServiceMonitor", "PodMonitor", "NetworkPolicy", "HorizontalPodAutoscaler"} <= kinds


def test_a_manifest_of_unknown_kind_fails_validation() -> None:
    unknown: Manifest = {
        "apiVersion": "sluice.dev/v1",
        "kind": "SluiceCluster",
        "metadata": {"name": "x"},
        "spec": {"brokers": 3},
    }
    problems = validate_manifests({"unknown": [unknown]})
    assert problems, "a kind without a schema must fail, not pass with a warning"
    assert any("SluiceCluster" in p.message for p in problems)


def test_an_unknown_field_fails_strict_validation(rendered: dict[str, list[Manifest]]) -> None:
    service = next(m for m in rendered["defaults"] if m["kind"] == "Service")
    broken = {**service, "spec": {**service["spec"], "clusterIPz": "None"}}
    problems = validate_manifests({"typo": [broken]})
    assert any("clusterIPz" in p.message for p in problems), problems


def test_a_crd_with_an_unknown_field_fails(rendered: dict[str, list[Manifest]]) -> None:
    monitor = next(m for m in rendered["all-features"] if m["kind"] == "ServiceMonitor")
    broken = {**monitor, "spec": {**monitor["spec"], "endpoint": monitor["spec"]["endpoints"]}}
    problems = validate_manifests({"typo": [broken]})
    assert any("endpoint" in p.message for p in problems), problems
    assert len(problems) == len(KUBE_VERSIONS)
