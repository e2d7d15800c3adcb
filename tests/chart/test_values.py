"""values.schema.json rejects bad types and shapes; templates/validate.yaml rejects contradictions."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import yaml

from tests.chart.chartlib import CHART, render, render_error

COMPONENTS = ("broker", "coordinator", "offsetStore", "dispatcher", "redis")


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("components.broker.replicas=abc", "/components/broker/replicas': got string, want integer"),
        (
            "components.coordinator.enabled=maybe",
            "/components/coordinator/enabled': got string, want boolean",
        ),
        ("components.broker.flush=sometimes", "/components/broker/flush"),
        ("components.dispatcher.service.port=70000", "/components/dispatcher/service/port"),
        ("components.broker.wire.port=0", "/components/broker/wire/port"),
        ("components.broker.wire.port=-1", "/components/broker/wire/port"),
        ("components.broker.wire.port=seven", "/components/broker/wire/port"),
        ("components.dispatcher.wire.port=0", "/components/dispatcher/wire/port"),
        ("components.dispatcher.wire.port=65536", "/components/dispatcher/wire/port"),
        ("components.dispatcher.wire.port=seven", "/components/dispatcher/wire/port"),
        ("components.broker.persistence.size=lots", "/components/broker/persistence/size"),
        ("components.scheduler.replicas=2", "/components/scheduler/replicas"),
        ("components.scheduler.schedule.maxDelay=forever", "/components/scheduler/schedule/maxDelay"),
        ("monitoring.kind=Probe", "/monitoring/kind"),
        ("externalRedis.url=http://redis:6379", "/externalRedis/url"),
        ("image.digest=latest", "/image/digest"),
    ],
)
def test_schema_rejects_a_wrong_type_or_value(setting: str, complaint: str) -> None:
    err = render_error(sets=[setting])
    assert "don't meet the specifications of the schema" in err
    assert complaint in err


@pytest.mark.parametrize(
    "setting",
    [
        "components.broker.replicaz=3",
        "components.kafka.enabled=true",
        "bogus=1",
        "components.broker.wire.portz=7611",
        "components.broker.service.wirePort=7611",
        "components.coordinator.wire.port=7610",
        "components.offsetStore.wire.port=7612",
        "components.dispatcher.wire.portz=7613",
        "components.dispatcher.service.wirePort=7613",
    ],
)
def test_schema_rejects_unknown_keys(setting: str) -> None:
    err = render_error(sets=[setting])
    assert "don't meet the specifications of the schema" in err


def test_every_component_has_the_same_shape() -> None:
    """The shared keys come from one $defs entry that every component block is built on."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    shared = set(schema["$defs"]["component"]["properties"])
    blocks = schema["properties"]["components"]["properties"]
    # The scheduler is a client of the cluster, not a service: no gRPC port, no config file, one replica.
    # Its block takes the shared definitions it has, by reference, and nothing unknown.
    scheduler = blocks.pop("scheduler")
    assert scheduler["additionalProperties"] is False
    assert scheduler["properties"]["replicas"]["const"] == 1
    own = {"schedule", "persistence", "replicas"}
    sluice_shared = shared | set(schema["$defs"]["sluiceComponent"]["properties"])
    assert set(scheduler["properties"]) - own <= sluice_shared
    assert set(blocks) == set(COMPONENTS)
    for name in COMPONENTS:
        assert blocks[name]["unevaluatedProperties"] is False
        assert blocks[name]["allOf"][0]["$ref"] in ("#/$defs/component", "#/$defs/sluiceComponent")
    assert schema["$defs"]["sluiceComponent"]["allOf"] == [{"$ref": "#/$defs/component"}]
    # And the defaults really have those keys, in every block.
    values = render_values()
    for name in COMPONENTS:
        assert shared <= set(values["components"][name]), name


def render_values() -> dict[str, Any]:
    loaded = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.mark.parametrize(
    ("sets", "complaint"),
    [
        (
            ["components.redis.enabled=false"],
            "neither externalRedis.url nor externalRedis.existingSecret is set",
        ),
        (["externalRedis.url=redis://r:6379/0"], "use the bundled Redis or an external one, not both"),
        (
            [
                "components.redis.enabled=false",
                "externalRedis.url=redis://r/0",
                "externalRedis.existingSecret=s",
            ],
            "set externalRedis.url or externalRedis.existingSecret, not both",
        ),
        (["components.redis.replicas=3"], "the bundled Redis is a single node"),
        (["components.broker.replicas=0"], "components.broker.replicas is 0: run at least one broker"),
        (
            ["components.broker.wire.port=7601"],
            "components.broker.service.port (7601), wire.port (7601) and metrics.port (9601) must all differ",
        ),
        (["components.broker.wire.port=9601"], "must all differ"),
        (
            ["components.dispatcher.wire.port=7603"],
            "components.dispatcher.service.port (7603), wire.port (7603) and metrics.port (9603) must all"
            " differ",
        ),
        (["components.dispatcher.wire.port=9603"], "components.dispatcher.service.port (7603)"),
        (["components.dispatcher.metrics.port=7613"], "components.dispatcher.service.port (7603)"),
        (
            ["components.coordinator.election.enabled=false"],
            "more than one coordinator needs leader election",
        ),
        (
            ["components.dispatcher.enabled=false", "components.dispatcher.autoscaling.enabled=true"],
            "there is nothing to scale",
        ),
        (
            [
                "components.dispatcher.autoscaling.enabled=true",
                "components.dispatcher.autoscaling.minReplicas=4",
                "components.dispatcher.autoscaling.maxReplicas=2",
            ],
            "minReplicas (4) is above maxReplicas (2)",
        ),
        (
            [
                "components.dispatcher.autoscaling.enabled=true",
                "components.dispatcher.resources.requests.cpu=null",
            ],
            "needs components.dispatcher.resources.requests.cpu",
        ),
        (
            ["components.broker.podDisruptionBudget.minAvailable=2"],
            "set minAvailable or maxUnavailable, not both",
        ),
        (["components.broker.podDisruptionBudget.maxUnavailable="], "needs minAvailable or maxUnavailable"),
        (["components.coordinator.enabled=false"], "brokers register with the coordinator"),
        (
            ["components.coordinator.rbac.create=false"],
            "rbac.create=false needs serviceAccount.name",
        ),
        (
            ["components.offsetStore.enabled=false"],
            "tests.enabled needs the broker, coordinator and offset store",
        ),
    ],
)
def test_validation_template_fails_on_contradictions(sets: list[str], complaint: str) -> None:
    err = render_error(sets=sets)
    assert "Invalid values for the sluice chart" in err
    assert complaint in err


def test_validation_lists_every_problem_at_once() -> None:
    err = render_error(sets=["components.broker.replicas=0", "components.coordinator.election.enabled=false"])
    assert "run at least one broker" in err
    assert "needs leader election" in err


def test_the_contradictions_have_working_resolutions() -> None:
    """Each failure message names a way out; the ways out render."""
    render(sets=["components.redis.enabled=false", "externalRedis.url=redis://r:6379/0"])
    render(sets=["components.coordinator.replicas=1", "components.coordinator.election.enabled=false"])
    render(
        sets=[
            "components.broker.podDisruptionBudget.minAvailable=0",
            "components.broker.podDisruptionBudget.maxUnavailable=",
        ]
    )
    render(sets=["components.dispatcher.enabled=false"])


def test_an_external_sentinel_managed_redis_is_accepted() -> None:
    """``redis+sentinel://`` addresses pass the schema and reach the services as their Redis URL."""
    url = "redis+sentinel://:pw@s1:26379,s2:26379/sluice/0"
    escaped = url.replace(",", "\\,")  # --set splits on commas
    docs = render(sets=["components.redis.enabled=false", f"externalRedis.url={escaped}"])
    [secret] = [d for d in docs if d["kind"] == "Secret" and "external-redis" in d["metadata"]["name"]]
    assert base64.b64decode(secret["data"]["redis-url"]).decode() == url
