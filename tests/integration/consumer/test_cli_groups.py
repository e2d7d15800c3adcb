"""The group commands of the real ``sluice`` CLI: consume --group, group list|describe|config|reset."""

from __future__ import annotations

import json

from tests.integration.consumer.conftest import Cluster
from tests.integration.consumer.test_seed_004 import sluice


def test_consume_with_a_group_commits_exactly_what_it_printed(cluster: Cluster) -> None:
    topic = cluster.topic(2, "cli")
    with cluster.client().producer(topic, partitioner="round_robin") as p:
        for i in range(10):
            p.send(f"m{i}".encode(), tag="a" if i % 2 else "b")
    args = ["consume", topic, "--group", "cli-g", "--from", "earliest", "--timeout", "5"]
    first = sluice(cluster, *args, "--max", "3", "--format", "json")
    assert first.returncode == 0, first.stderr
    lines = [json.loads(line) for line in first.stdout.splitlines()]
    assert len(lines) == 3
    admin = cluster.client().admin
    assert sum(admin.group_offsets("cli-g").values()) == 3  # the 3 printed, not the prefetched rest
    rest = sluice(cluster, *args, "--timeout", "2")
    assert rest.returncode == 0, rest.stderr
    values = [line["value"] for line in lines] + rest.stdout.split()
    assert sorted(values) == sorted(f"m{i}" for i in range(10))
    assert sum(admin.group_offsets("cli-g").values()) == 10

    other = ["consume", topic, "--group", "cli-filtered", "--from", "earliest"]
    filtered = sluice(cluster, *other, "--filter", "a", "--timeout", "2")
    assert filtered.returncode == 0, filtered.stderr
    assert sorted(filtered.stdout.split()) == [f"m{i}" for i in range(1, 10, 2)]
    bad = sluice(cluster, *other, "--filter", "a ||")
    assert bad.returncode == 1
    assert "INVALID_FILTER" in bad.stderr

    listed = sluice(cluster, "group", "list")
    assert listed.returncode == 0, listed.stderr
    assert any(line.split()[:3] == ["cli-g", "empty", "0"] for line in listed.stdout.splitlines())

    described = sluice(cluster, "group", "describe", "cli-g", "--format", "json")
    assert described.returncode == 0, described.stderr
    doc = json.loads(described.stdout)
    assert {(o["partition"], o["committed"], o["lag"]) for o in doc["offsets"]} == {(0, 5, 0), (1, 5, 0)}
    text = sluice(cluster, "group", "describe", "cli-g")
    assert "COMMITTED" in text.stdout
    assert "LAG" in text.stdout

    preview = sluice(cluster, "group", "reset-offsets", "cli-g", "--topic", f"{topic}:1", "--to-offset", "2")
    assert preview.returncode == 0, preview.stderr
    assert admin.group_offsets("cli-g") == {(topic, 0): 5, (topic, 1): 5}  # a preview changes nothing
    reset = sluice(
        cluster, "group", "reset-offsets", "cli-g", "--topic", f"{topic}:1", "--to-offset", "2", "--execute"
    )
    assert reset.returncode == 0, reset.stderr
    assert admin.group_offsets("cli-g") == {(topic, 0): 5, (topic, 1): 2}
    reset = sluice(cluster, "group", "reset-offsets", "cli-g", "--topic", topic, "--to-earliest", "--execute")
    assert reset.returncode == 0, reset.stderr
    assert admin.group_offsets("cli-g") == {(topic, 0): 0, (topic, 1): 0}


def test_reset_offsets_is_refused_while_the_group_has_live_members(cluster: Cluster) -> None:
    topic = cluster.topic(1, "cli-live")
    member = cluster.client().consumer("cli-live", [topic], session_timeout="10s")
    args = ["group", "reset-offsets", "cli-live", "--topic", topic, "--to-latest", "--execute"]
    refused = sluice(cluster, *args)
    assert refused.returncode == 1
    assert "GROUP_NOT_EMPTY" in refused.stderr
    member.close()
    assert sluice(cluster, *args).returncode == 0


def test_group_config(cluster: Cluster) -> None:
    out = sluice(cluster, "group", "config", "cli-cfg", "--conflict-policy", "split", "--assignor", "range")
    assert out.returncode == 0, out.stderr
    assert "conflict_policy=split" in out.stdout
    assert "assignor=range" in out.stdout
    bad = sluice(cluster, "group", "config", "cli-cfg", "--assignor", "nope")
    assert bad.returncode == 1
    assert "UNKNOWN_ASSIGNOR" in bad.stderr
    usage = sluice(cluster, "group", "config", "cli-cfg")
    assert usage.returncode == 2
    unknown = sluice(cluster, "group", "describe", "never-seen")
    assert unknown.returncode == 1
    assert "UNKNOWN_GROUP" in unknown.stderr
