"""``sluice consume --subscription`` and ``sluice subscription list|describe``, as processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sluice import Client
from tests.harness import ROOT, SERVICES
from tests.integration.push.conftest import PushCluster
from tests.integration.push.helpers import produce


def sluice(cluster: PushCluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, PYTHONPATH=str(SERVICES))
    return subprocess.run(
        [sys.executable, "-m", "sluice", "--bootstrap", cluster.bootstrap, *args],
        capture_output=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
        check=False,
    )


def test_consume_subscription_prints_acks_and_describes(
    cluster: PushCluster, client: Client, topic: str
) -> None:
    produce(client, topic, 30, key=lambda i: b"k%d" % i)
    first = sluice(
        cluster, "consume", topic, "--subscription", "cli", "--type", "shared", "--from", "earliest",
        "--receiver-queue", "0", "--max", "20", "--format", "json",
    )  # fmt: skip
    assert first.returncode == 0, first.stderr.decode()
    lines = [json.loads(line) for line in first.stdout.decode().splitlines()]
    assert len(lines) == 20
    assert {"partition", "offset", "key", "value", "redelivery_count"} <= set(lines[0])
    # The 20 printed were acked; the rest of the durable subscription is still there.
    rest = sluice(
        cluster, "consume", topic, "--subscription", "cli", "--type", "shared", "--timeout", "1",
    )  # fmt: skip
    assert rest.returncode == 0, rest.stderr.decode()
    values = [int(v) for v in rest.stdout.decode().split()] + [int(x["value"]) for x in lines]
    assert sorted(values) == list(range(30))

    with client.push_consumer(topic, "cli", "shared", consumer_name="watcher", receiver_queue_size=7):
        listed = sluice(cluster, "subscription", "list", topic, "--format", "json")
        assert listed.returncode == 0, listed.stderr.decode()
        (sub,) = json.loads(listed.stdout)
        assert (sub["subscription"], sub["type"], sub["consumers"], sub["backlog"]) == ("cli", "shared", 1, 0)
        described = sluice(cluster, "subscription", "describe", topic, "cli", "--format", "json")
        assert described.returncode == 0, described.stderr.decode()
        doc = json.loads(described.stdout)
        (consumer,) = doc["consumers"]
        assert consumer["consumer_name"] == "watcher"
        assert consumer["permits"] == 7
        assert consumer["unacked"] == 0
        assert consumer["blocked"] is False
        text = sluice(cluster, "subscription", "describe", topic, "cli")
        assert b"watcher" in text.stdout
        assert b"PERMITS" in text.stdout

    busy = sluice(cluster, "subscription", "describe", topic, "nope")
    assert busy.returncode == 1
    assert b"UNKNOWN_SUBSCRIPTION" in busy.stderr
