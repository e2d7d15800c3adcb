"""``sluice up --brokers 3``: three local brokers, topics replicated on all of them by default, and
``topic describe`` showing leader, replicas, ISR and leader epoch (docs/cli.md, docs/replication.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.integration.cli.test_cli_system import ok, sluice, start_up


def test_up_with_three_brokers_places_a_factor_three_topic_on_all_of_them(tmp_path: Path) -> None:
    stack = start_up(tmp_path / "data", "--brokers", "3")
    try:
        assert {"broker-0", "broker-1", "broker-2"} <= set(stack.pids)
        for i in range(3):
            assert (stack.data_dir / f"broker-{i}").is_dir()
        # All three register within a heartbeat of their ready lines; until then a factor-3 topic is
        # refused with INVALID_REPLICATION_FACTOR (never placed under-replicated).
        deadline = time.monotonic() + 30
        while True:
            created = sluice(stack, "topic", "create", "rep3", "--partitions", "3")
            if created.returncode == 0 or time.monotonic() > deadline:
                break
            assert "INVALID_REPLICATION_FACTOR" in created.stderr.decode(), created.stderr.decode()
            time.sleep(0.5)
        assert "replication factor 3" in ok(created)  # the default: min(3, brokers)

        doc = json.loads(ok(sluice(stack, "topic", "describe", "rep3", "--format", "json")))
        assert doc["replication_factor"] == 3
        assert doc["min_insync_replicas"] == 2
        assert doc["unclean_leader_election"] is False
        leaders = []
        for part in doc["partitions"]:
            assert sorted(part["replicas"]) == [0, 1, 2]
            assert part["isr"] == part["replicas"]
            assert part["leader"] == part["broker_id"] == part["replicas"][0]
            assert part["leader_epoch"] == 0
            leaders.append(part["leader"])
        assert sorted(leaders) == [0, 1, 2]  # one partition led by each broker

        text = ok(sluice(stack, "topic", "describe", "rep3"))
        assert "Replicas:   3 (min in-sync 2, unclean leader election off)" in text
        header = next(line for line in text.splitlines() if line.startswith("PARTITION"))
        columns = ["PARTITION", "LEADER", "REPLICAS", "ISR", "EPOCH", "DISPATCHER", "START", "HW", "LEO"]
        assert header.split() == columns

        # Produce and consume go to each partition's leader, as before.
        ok(sluice(stack, "produce", "rep3", stdin=b"a\nb\nc\nd\n"))
        consumed = ok(sluice(stack, "consume", "rep3", "--from", "earliest", "--max", "4"))
        assert sorted(consumed.split()) == ["a", "b", "c", "d"]
        # The high watermark and the leader's log end per partition, from the leaders (acks=all: the four
        # records are committed, so both are at the end).
        doc = json.loads(ok(sluice(stack, "topic", "describe", "rep3", "--format", "json")))
        assert sum(p["high_watermark"] for p in doc["partitions"]) == 4
        for part in doc["partitions"]:
            assert part["high_watermark"] == part["log_end_offset"] == part["end_offset"]
            assert (part["adding_replicas"], part["removing_replicas"]) == ([], [])

        # Too many replicas, and min ISR above the factor: typed errors, nothing created.
        four = sluice(stack, "topic", "create", "rep4", "--replication-factor", "4")
        assert four.returncode == 1
        assert four.stderr.decode().startswith("error: INVALID_REPLICATION_FACTOR: ")
        bad_isr = sluice(stack, "topic", "create", "rep5", "-r", "2", "--min-insync-replicas", "3")
        assert bad_isr.returncode == 1
        assert bad_isr.stderr.decode().startswith("error: INVALID_ARGUMENT: ")
        assert "rep4" not in ok(sluice(stack, "topic", "list")).split()
        one = json.loads(
            ok(sluice(stack, "topic", "create", "rep1", "-r", "1", "--unclean-leader-election", "-f", "json"))
        )
        assert (one["replication_factor"], one["min_insync_replicas"]) == (1, 1)
        assert one["unclean_leader_election"] is True

        # topic alter: min in-sync replicas and unclean election of an existing topic.
        altered = ok(sluice(stack, "topic", "alter", "rep3", "--min-insync-replicas", "3"))
        assert "min in-sync replicas 3, unclean leader election off" in altered
        ok(sluice(stack, "topic", "alter", "rep3", "--unclean-leader-election", "on"))
        doc = json.loads(ok(sluice(stack, "topic", "describe", "rep3", "--format", "json")))
        assert (doc["min_insync_replicas"], doc["unclean_leader_election"]) == (3, True)
        too_many = sluice(stack, "topic", "alter", "rep3", "--min-insync-replicas", "4")
        assert too_many.stderr.decode().startswith("error: INVALID_ARGUMENT: ")
        nothing = sluice(stack, "topic", "alter", "rep3")
        assert nothing.returncode != 0
        assert "nothing to alter" in nothing.stderr.decode()

        # topic elect-leaders: every partition is led by its preferred replica already.
        balanced = ok(sluice(stack, "topic", "elect-leaders", "rep3"))
        assert "led by its preferred replica already" in balanced
        assert json.loads(ok(sluice(stack, "topic", "elect-leaders", "-f", "json"))) == []
        unknown = sluice(stack, "topic", "elect-leaders", "nope")
        assert unknown.returncode == 1
        assert unknown.stderr.decode().startswith("error: UNKNOWN_TOPIC")
    finally:
        assert stack.stop() == 0
