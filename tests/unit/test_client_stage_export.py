"""The SDK's stage histograms exported to Prometheus (``stages.register_prometheus``).

Outside tests/unit/client because prometheus-client is not in the slim SDK install whose unit tests
tests/packaging runs at the dependency floors: an application that serves metrics brings it.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from sluice.client import stages
from sluice.client.stages import STAGES


def test_snapshot_and_prometheus_export_name_every_stage() -> None:
    stages.stage("fetch_decode").observe(0.001)
    snap = stages.snapshot()
    assert set(snap) == set(STAGES)
    assert snap["fetch_decode"]["count"] >= 1
    registry = CollectorRegistry()
    stages.register_prometheus(registry)
    for name in STAGES:
        count = registry.get_sample_value("sluice_client_stage_seconds_count", {"stage": name})
        assert count == snap[name]["count"] or (name == "fetch_decode" and count is not None)
