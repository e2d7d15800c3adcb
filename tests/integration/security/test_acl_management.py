"""ACL management as users do it: ``client.admin`` and the real ``sluice acl`` CLI, against a real coordinator
process and Redis (and the audit line the coordinator writes for each change)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

import sluice
from sluice import AclEntry, AclFilter, Client, Operation, PatternType, Permission, ResourceType
from sluice.errors import InvalidArgument
from tests.harness import ROOT, SERVICES, RedisServer, run_redis
from tests.integration.coordinator.coordinator_peers import Coordinator, run_coordinator


@pytest.fixture(scope="module")
def coordinator() -> Iterator[Coordinator]:
    redis_server: RedisServer
    with run_redis() as redis_server:
        args = ("--port", "0", "--metrics-port", "0", "--redis-url", redis_server.url, "--key-prefix", "mgmt")
        with run_coordinator(*args) as c:
            yield c


@pytest.fixture
def client(coordinator: Coordinator) -> Iterator[Client]:
    with sluice.Client(coordinator.address, request_timeout=10) as c:
        c.admin.delete_acls(AclFilter())  # every test starts empty
        yield c


def cli(coordinator: Coordinator, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sluice",
            "--bootstrap",
            coordinator.address,
            "--request-timeout",
            "10",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(SERVICES)},
        cwd=ROOT,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def cli_json(coordinator: Coordinator, *args: str) -> Any:
    return json.loads(ok(cli(coordinator, *args, "--json")))


# ---- the admin SDK ------------------------------------------------------------------------------------


def test_sdk_create_describe_delete(client: Client, coordinator: Coordinator) -> None:
    read = AclEntry.of("alice", ResourceType.TOPIC, "orders", Operation.READ)
    deny = AclEntry.of("*", "group", "tmp-", "all", Permission.DENY, PatternType.PREFIXED)
    v1 = client.admin.create_acls([read, deny])
    assert client.admin.create_acls([read]) == v1  # present already: no change, same version
    assert client.admin.describe_acls() == sorted([read, deny])
    assert client.admin.describe_acls(AclFilter(permission=Permission.DENY)) == [deny]
    assert client.admin.describe_acls(AclFilter(principal="nobody")) == []
    assert client.admin.delete_acls(AclFilter(principal="alice")) == [read]
    assert client.admin.describe_acls() == [deny]
    # The change is audited by the coordinator: who (anonymous until authentication is wired), what.
    deadline = time.monotonic() + 5
    while '"action":"acl.remove"' not in coordinator.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    audit = [line for line in coordinator.log().splitlines() if '"action":"acl.' in line]
    assert any('"action":"acl.add"' in line and '"principal":"alice"' in line for line in audit), audit
    assert any('"action":"acl.remove"' in line for line in audit), audit


def test_sdk_refuses_bad_input_before_sending(client: Client) -> None:
    with pytest.raises(InvalidArgument, match="no ACL entries"):
        client.admin.create_acls([])
    with pytest.raises(InvalidArgument, match="unknown operation"):
        client.admin.create_acls([AclEntry.of("alice", "topic", "t", "fly")])
    with pytest.raises(InvalidArgument, match="no ACL filters"):
        client.admin.delete_acls([])


# ---- the CLI ----------------------------------------------------------------------------------------


def test_cli_add_list_remove(client: Client, coordinator: Coordinator) -> None:
    out = ok(
        cli(
            coordinator,
            "acl", "add", "--principal", "alice", "--principal", "bob",
            "--topic", "orders", "--operation", "read", "--operation", "write",
        )
    )  # fmt: skip
    assert out.startswith("Added 4 ACL entries (security version ")
    assert "PRINCIPAL  RESOURCE  PATTERN  NAME    OPERATION  PERMISSION" in out
    ok(
        cli(
            coordinator,
            "acl",
            "add",
            "--principal",
            "*",
            "--group",
            "app-",
            "--prefixed",
            "--operation",
            "all",
            "--deny",
        )
    )
    ok(cli(coordinator, "acl", "add", "--principal", "ops", "--cluster", "--operation", "alter"))

    # What the CLI wrote is what the SDK reads.
    assert AclEntry.of("*", "group", "app-", "all", "deny", "prefixed") in client.admin.describe_acls()
    assert AclEntry.of("ops", "cluster", "*", "alter") in client.admin.describe_acls()

    everything = cli_json(coordinator, "acl", "list")
    assert len(everything) == 6
    alice = cli_json(coordinator, "acl", "list", "--principal", "alice")
    assert [(e["name"], e["operation"]) for e in alice] == [("orders", "read"), ("orders", "write")]
    denies = cli_json(coordinator, "acl", "list", "--deny")
    assert [(e["principal"], e["pattern"], e["name"]) for e in denies] == [("*", "prefixed", "app-")]
    # A name without --prefixed selects literal entries only.
    assert cli_json(coordinator, "acl", "list", "--group", "app-") == []
    table = ok(cli(coordinator, "acl", "list", "--topic", "orders", "--operation", "write"))
    assert [line.split()[0] for line in table.splitlines()[1:]] == ["alice", "bob"]

    removed = cli_json(coordinator, "acl", "remove", "--principal", "bob", "--topic", "orders")
    assert sorted(e["operation"] for e in removed) == ["read", "write"]
    assert len(cli_json(coordinator, "acl", "list")) == 4


def test_cli_usage_and_typed_errors(coordinator: Coordinator) -> None:
    no_resource = cli(coordinator, "acl", "add", "--principal", "alice", "--operation", "read")
    assert no_resource.returncode == 2
    assert "one of the arguments --topic --group --subscription --cluster is required" in no_resource.stderr
    no_operation = cli(coordinator, "acl", "add", "--principal", "alice", "--topic", "t")
    assert (no_operation.returncode, "give at least one --operation" in no_operation.stderr) == (2, True)
    bad_op = cli(coordinator, "acl", "add", "--principal", "a", "--topic", "t", "--operation", "fly")
    assert bad_op.returncode == 2
    assert "invalid choice" in bad_op.stderr
    everything = cli(coordinator, "acl", "remove")
    assert everything.returncode == 2
    assert "to select what to remove" in everything.stderr
    prefixed_cluster = cli(
        coordinator, "acl", "add", "--principal", "a", "--cluster", "--prefixed", "--operation", "alter"
    )
    assert prefixed_cluster.returncode == 2
    empty_principal = cli(coordinator, "acl", "add", "--principal", "", "--topic", "t", "--operation", "read")
    assert empty_principal.returncode == 1
    assert empty_principal.stderr.startswith("error: INVALID_ARGUMENT: an ACL's principal must not be empty")
    assert "Traceback" not in empty_principal.stderr
