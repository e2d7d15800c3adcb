"""NOTES.txt (what `helm install` and `helm upgrade` print) renders for the defaults and for each
external-access mode, carries the upgrade notes, and points to docs/upgrading.md, which names every
value those notes say this version adds. `helm template` never renders NOTES.txt, so an error there
would otherwise surface only in a user's `helm install`."""

from __future__ import annotations

import re

import pytest

from tests.chart.chartlib import CHART, ROOT, helm

UPGRADING = ROOT / "docs" / "upgrading.md"
EXTERNAL = "components.broker.externalAccess"


def notes(*sets: str) -> str:
    args = ["install", "sluice", str(CHART), "--namespace", "shop", "--dry-run=client"]
    for item in sets:
        args += ["--set", item]
    out = helm(*args).stdout
    assert "NOTES:" in out, out[-2000:]
    return out.split("NOTES:", 1)[1]


def test_the_notes_carry_the_upgrade_notes_and_point_to_docs_upgrading() -> None:
    text = notes()
    assert "Upgrading: a rolling restart, one pod at a time." in text
    assert "see docs/upgrading.md" in text
    assert "sluice-coordinator.shop.svc.cluster.local:7600" in text
    assert "monitoring.rules.enabled=true" in text  # the alert rules are off by default: say how
    assert "monitoring.rules.enabled=true" not in notes("monitoring.rules.enabled=true")


def test_every_value_the_upgrade_notes_name_is_in_docs_upgrading() -> None:
    text = " ".join(notes().split())
    added = text[text.index("This version adds") : text.index("see docs/upgrading.md")]
    guide = UPGRADING.read_text()
    named = {
        "zoneSpread": "components.broker.zoneSpread",
        "external access": "components.broker.externalAccess",
        "priorityClassName": "priorityClassName",
        "extra containers/volumes": "extraContainers, extraVolumes, extraVolumeMounts",
    }
    for words, value in named.items():
        assert words in added, f"the upgrade notes no longer mention {words!r}: update this test"
        assert value in guide, f"docs/upgrading.md does not explain {value}"


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        (
            [
                "components.broker.externalAccess.enabled=true",
                "components.broker.externalAccess.domain=q.example",
            ],
            r"Each broker advertises <pod>\.q\.example:7601 \(wire 7611\)",
        ),
        (
            [
                "components.broker.externalAccess.enabled=true",
                "components.broker.externalAccess.type=NodePort",
            ],
            r"Broker <i> advertises its node's IP with node ports 31700\+i \(gRPC\) and 31800\+i \(wire\)",
        ),
    ],
)
def test_external_access_says_what_each_broker_advertises(sets: list[str], says: str) -> None:
    text = " ".join(notes(*sets).split())
    assert re.search(says, text), text
    assert "External access: each broker has a" in text
