"""Group administration with the real ``sluice`` CLI against a real ``sluice up`` stack (Redis, coordinator,
broker, offset store, dispatcher as processes): ``group reset-offsets`` (preview, then ``--execute``),
``group delete``, lag in time in ``group describe``, and ``consume --from offset:N|time:ISO|-15m``."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from sluice import Client
from sluice.common.units import iso_ms
from tests.integration.cli.test_cli_system import Up, json_lines, ok, sluice, start_up

REDIS_URL = re.compile(r"^\s+redis\s+(redis://\S+)")


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    stack = start_up(tmp_path_factory.mktemp("cli-admin") / "data")
    try:
        yield stack
    finally:
        stack.stop()


def redis_of(up: Up) -> redis.Redis:
    """The private Redis that ``sluice up`` started, from its banner."""
    for line in up.stdout:
        if m := REDIS_URL.match(line):
            return redis.Redis.from_url(m.group(1))
    raise AssertionError(f"no redis line in the banner:\n{''.join(up.stdout)}")


def js(up: Up, *args: str) -> Any:
    return json.loads(ok(sluice(up, *args, "--format", "json")))


def failed(up: Up, *args: str) -> str:
    """Run a command that must fail with a typed error; its ``error:`` line."""
    result = sluice(up, *args)
    err = result.stderr.decode()
    assert result.returncode == 1, (result.returncode, err, result.stdout.decode())
    assert err.startswith("error: "), err
    assert "Traceback" not in err
    return err


def committed(up: Up, group: str) -> dict[tuple[str, int], int | None]:
    doc = js(up, "group", "describe", group)
    return {(o["topic"], o["partition"]): o["committed"] for o in doc["offsets"]}


def produce(up: Up, topic: str, partition: int, count: int, prefix: str = "m") -> None:
    lines = "".join(f"{prefix}{i}\n" for i in range(count)).encode()
    ok(sluice(up, "produce", topic, "--partition", str(partition), "-q", stdin=lines))


def test_reset_offsets_previews_by_default_and_changes_only_with_execute(up: Up) -> None:
    ok(sluice(up, "topic", "create", "adm-reset", "--partitions", "2"))
    produce(up, "adm-reset", 0, 5, "old")
    time.sleep(1.1)  # two generations of records, a second apart
    middle = int(time.time() * 1000)
    time.sleep(0.1)
    produce(up, "adm-reset", 0, 15, "new")
    produce(up, "adm-reset", 1, 10)
    g, reset = "adm-g", ["group", "reset-offsets", "adm-g"]

    # A group that never ran can be given offsets (Kafka allows this too): first a preview...
    plan = js(up, *reset, "--topic", "adm-reset", "--to-offset", "12")
    assert plan["executed"] is False
    rows = {p["partition"]: p for p in plan["partitions"]}
    assert (rows[0]["current"], rows[0]["new"], rows[0]["clamped"]) == (None, 12, None)
    # ... partition 1 has 10 records: 12 is past its end, clamped, and the preview says so.
    assert (rows[1]["new"], rows[1]["clamped"], rows[1]["requested"]) == (10, "log_end", 12)
    assert (rows[1]["log_start_offset"], rows[1]["log_end_offset"]) == (0, 10)
    failed(up, "group", "describe", g)  # the preview wrote nothing: the group does not exist yet
    text = ok(sluice(up, *reset, "--topic", "adm-reset", "--to-offset", "12"))
    assert "Nothing changed: add --execute" in text
    assert "12 is past the log end: clamped to it" in text

    ok(sluice(up, *reset, "--topic", "adm-reset", "--to-offset", "12", "--execute"))
    assert committed(up, g) == {("adm-reset", 0): 12, ("adm-reset", 1): 10}

    # Per partition, and a shift below the log start is clamped to it.
    shift = js(up, *reset, "--topic", "adm-reset:1", "--shift-by", "-15", "--execute")
    assert [(p["partition"], p["current"], p["new"], p["clamped"]) for p in shift["partitions"]] == [
        (1, 10, 0, "log_start")
    ]
    assert committed(up, g) == {("adm-reset", 0): 12, ("adm-reset", 1): 0}

    # A time: the first record at or after it (all of partition 1 came later); every topic the group
    # has committed.
    when = iso_ms(middle)
    at = js(up, *reset, "--all-topics", "--to-datetime", when, "--execute")
    assert {p["partition"]: (p["current"], p["new"]) for p in at["partitions"]} == {0: (12, 5), 1: (0, 0)}
    back = js(up, *reset, "--all-topics", "--by-duration", "1h", "--execute")
    assert {p["partition"]: (p["current"], p["new"]) for p in back["partitions"]} == {0: (5, 0), 1: (0, 0)}
    ok(sluice(up, *reset, "--topic", "adm-reset", "--to-latest", "--execute"))
    assert committed(up, g) == {("adm-reset", 0): 20, ("adm-reset", 1): 10}
    ok(sluice(up, *reset, "--topic", "adm-reset:0", "--to-earliest", "--execute"))
    assert committed(up, g) == {("adm-reset", 0): 0, ("adm-reset", 1): 10}


def test_bad_input_gets_typed_errors_naming_the_problem(up: Up) -> None:
    ok(sluice(up, "topic", "create", "adm-bad", "--partitions", "1"))
    produce(up, "adm-bad", 0, 3)
    reset = ["group", "reset-offsets", "adm-bad-g"]
    with Client(up.bootstrap) as client:
        member = client.consumer("adm-bad-g", ["adm-bad"], auto_offset_reset="earliest")
        try:
            member.poll(2)
            err = failed(up, *reset, "--topic", "adm-bad", "--to-earliest")  # a preview too
            assert err.startswith("error: GROUP_NOT_EMPTY: ")
            assert "1 live member" in err
            err = failed(up, "group", "delete", "adm-bad-g")
            assert err.startswith("error: GROUP_NOT_EMPTY: ")
            assert "active member" in err
        finally:
            member.close()
    err = failed(up, *reset, "--topic", "adm-bad", "--to-datetime", "2999-01-01T00:00:00Z")
    assert err.startswith(
        "error: INVALID_ARGUMENT: reset to 2999-01-01T00:00:00.000Z: that time is in the future"
    )
    err = failed(up, *reset, "--topic", "no-such-topic", "--to-earliest")
    assert err.startswith("error: UNKNOWN_TOPIC_OR_PARTITION: topic 'no-such-topic' does not exist")
    err = failed(up, *reset, "--topic", "adm-bad:3", "--to-earliest")
    assert "no partition 3" in err
    err = failed(up, "group", "reset-offsets", "never-was", "--all-topics", "--to-earliest")
    assert err.startswith("error: UNKNOWN_GROUP: ")
    err = failed(up, "group", "reset-offsets", "never-was", "--topic", "adm-bad", "--shift-by", "1")
    assert "cannot shift partitions without a committed offset: adm-bad/0" in err
    assert failed(up, "group", "delete", "never-was").startswith("error: UNKNOWN_GROUP: ")
    assert failed(up, "group", "describe", "never-was").startswith("error: UNKNOWN_GROUP: ")


def test_delete_group_removes_its_state_and_every_key(up: Up) -> None:
    ok(sluice(up, "topic", "create", "adm-del", "--partitions", "2"))
    produce(up, "adm-del", 0, 4)
    produce(up, "adm-del", 1, 4)
    r = redis_of(up)
    before = sorted(r.keys("*"))
    args = [
        "consume",
        "adm-del",
        "--group",
        "adm-del-g",
        "--from",
        "earliest",
        "--max",
        "8",
        "--timeout",
        "5",
    ]
    assert len(ok(sluice(up, *args)).split()) == 8
    ok(sluice(up, "group", "config", "adm-del-g", "--conflict-policy", "split"))
    # Offsets on another track too (a reset may name any track): a delete takes every track.
    ok(
        sluice(
            up,
            "group",
            "reset-offsets",
            "adm-del-g",
            "-t",
            "adm-del",
            "--to-offset",
            "1",
            "--track",
            "tagB",
            "--execute",
        )
    )
    assert sorted(r.keys("*")) != before
    assert "adm-del-g" in ok(sluice(up, "group", "list"))

    doc = js(up, "group", "delete", "adm-del-g")
    assert doc == {"group": "adm-del-g", "deleted": True, "offsets_deleted": 4}
    assert sorted(r.keys("*")) == before  # nothing of the group is left in Redis
    records = r.hkeys("sluice:coordinator:records")
    assert not [f for f in records if b"adm-del-g" in f]
    assert "adm-del-g" not in ok(sluice(up, "group", "list"))
    assert failed(up, "group", "describe", "adm-del-g").startswith("error: UNKNOWN_GROUP: ")
    # The name is free again: a new group of that name starts from scratch.
    assert len(ok(sluice(up, *args)).split()) == 8


def test_describe_shows_lag_in_records_and_in_seconds(up: Up) -> None:
    ok(sluice(up, "topic", "create", "adm-lag", "--partitions", "2"))
    produce(up, "adm-lag", 0, 6)
    produce(up, "adm-lag", 1, 3)
    records = json_lines(sluice(up, "consume", "adm-lag", "--from", "earliest", "--max", "9", "-f", "json"))
    stamp = {(r["partition"], r["offset"]): r["timestamp"] for r in records}
    reset = ["group", "reset-offsets", "adm-lag-g", "--execute"]
    ok(sluice(up, *reset, "--topic", "adm-lag:0", "--to-offset", "2"))
    ok(sluice(up, *reset, "--topic", "adm-lag:1", "--to-latest"))
    time.sleep(1.5)
    asked = time.time() * 1000
    doc = js(up, "group", "describe", "adm-lag-g")
    rows = {o["partition"]: o for o in doc["offsets"]}
    # Partition 0: 4 records behind, the oldest unconsumed is the one at offset 2.
    assert (rows[0]["committed"], rows[0]["lag"]) == (2, 4)
    assert rows[0]["first_unconsumed_timestamp"] == stamp[(0, 2)]
    assert 1.5 <= rows[0]["lag_seconds"] <= (asked - stamp[(0, 2)]) / 1000 + 10
    # Partition 1: caught up, 0 seconds behind however old its records are.
    assert (rows[1]["lag"], rows[1]["lag_seconds"], rows[1]["first_unconsumed_timestamp"]) == (0, 0, None)
    text = ok(sluice(up, "group", "describe", "adm-lag-g"))
    assert "LAG-TIME" in text
    line = next(x for x in text.splitlines() if x.split()[:2] == ["adm-lag", "0"])
    assert re.search(r"\s4\s+\d+(\.\d+)?s\s", line), line


def test_consume_from_an_offset_a_time_or_a_duration_back(up: Up) -> None:
    ok(sluice(up, "topic", "create", "adm-from", "--partitions", "1"))
    produce(up, "adm-from", 0, 3, "a")
    time.sleep(1.1)
    middle = iso_ms(int(time.time() * 1000))
    time.sleep(0.1)
    produce(up, "adm-from", 0, 3, "b")
    read = ["consume", "adm-from", "--timeout", "1.5"]
    assert ok(sluice(up, *read, "--from", "offset:4")).split() == ["b1", "b2"]
    assert ok(sluice(up, *read, "--from", f"time:{middle}")).split() == ["b0", "b1", "b2"]
    assert ok(sluice(up, *read, "--from", "-1h")).split() == ["a0", "a1", "a2", "b0", "b1", "b2"]
    # Past the log end: clamped to it (said on stderr), so only new records would come.
    past = sluice(up, *read, "--from", "offset:99")
    assert ok(past) == ""
    assert "offset 99 is outside the log [0, 6]; starting at the log end, 6" in past.stderr.decode()
    err = failed(up, *read, "--from", "time:2999-01-01")
    assert err.startswith("error: INVALID_ARGUMENT: --from time: 2999-01-01")
    assert "is in the future" in err
    # With a group, only earliest|latest apply (where it has no committed offset): a usage error.
    usage = sluice(up, *read, "--group", "adm-from-g", "--from", "offset:1")
    assert usage.returncode == 2
    assert "group reset-offsets" in usage.stderr.decode()


def test_docs_show_every_admin_command() -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "cli.md").read_text()
    for command in (
        "sluice group reset-offsets",
        "--execute",
        "sluice group delete",
        "sluice group describe",
        "LAG-TIME",
        "--from offset:",
        "--from time:",
        "--from -15m",
    ):
        assert command in doc, command
