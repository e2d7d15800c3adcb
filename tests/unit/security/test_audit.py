"""The audit log: one JSON line per denial (and the counter), one per security change."""

from __future__ import annotations

import json
import logging

import pytest
from prometheus_client import REGISTRY

from sluice.security.audit import AUDIT_LOGGER, audit_change, audit_denied
from sluice.security.model import CLUSTER_RESOURCE, Operation, Principal, Resource, ResourceType


def denied_total(service: str, operation: str, resource_type: str) -> float:
    labels = {"service": service, "operation": operation, "resource_type": resource_type}
    return REGISTRY.get_sample_value("sluice_authorization_denied_total", labels) or 0.0


def audit_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == AUDIT_LOGGER]


def test_a_denial_is_one_json_line_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    before = denied_total("broker", "read", "topic")
    other = denied_total("broker", "write", "topic")
    with caplog.at_level(logging.INFO, logger=AUDIT_LOGGER):
        audit_denied(
            Principal("alice", "scram"),
            Operation.READ,
            Resource(ResourceType.TOPIC, "orders"),
            "ipv4:10.0.0.7:51234",
            "broker",
        )
    [line] = audit_lines(caplog)
    assert line == {
        "event": "denied",
        "principal": "alice",
        "mechanism": "scram",
        "operation": "read",
        "resource_type": "topic",
        "resource": "orders",
        "address": "ipv4:10.0.0.7:51234",
        "service": "broker",
    }
    assert caplog.records[-1].levelno == logging.WARNING
    assert denied_total("broker", "read", "topic") == before + 1
    assert denied_total("broker", "write", "topic") == other


def test_a_denial_on_the_cluster_by_an_anonymous_caller(caplog: pytest.LogCaptureFixture) -> None:
    before = denied_total("dispatcher", "cluster_action", "cluster")
    with caplog.at_level(logging.INFO, logger=AUDIT_LOGGER):
        audit_denied(Principal(), Operation.CLUSTER_ACTION, CLUSTER_RESOURCE, "ipv6:[::1]:4000", "dispatcher")
    [line] = audit_lines(caplog)
    assert (line["principal"], line["resource_type"], line["resource"]) == ("", "cluster", "")
    assert denied_total("dispatcher", "cluster_action", "cluster") == before + 1


def test_a_change_names_who_what_and_from_where(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=AUDIT_LOGGER):
        audit_change(
            Principal("admin", "scram"), "acl.add", {"acls": [{"principal": "bob"}]}, "ipv4:1.2.3.4:5"
        )
        audit_change(None, "topic.delete", {"topic": "old"})
    first, second = audit_lines(caplog)
    assert first == {
        "event": "change",
        "principal": "admin",
        "mechanism": "scram",
        "action": "acl.add",
        "detail": {"acls": [{"principal": "bob"}]},
        "address": "ipv4:1.2.3.4:5",
    }
    assert (second["principal"], second["action"], second["detail"]) == ("", "topic.delete", {"topic": "old"})
    assert all(r.levelno == logging.INFO for r in caplog.records)
