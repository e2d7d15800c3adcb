"""The CLI against a real ``sluice up`` stack: private Redis, coordinator and broker processes.

One stack serves the topic/produce/consume tests; the stop tests start their own
so they can end it.
"""

from __future__ import annotations

import base64
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.harness import ROOT, _env, run_redis

BOOTSTRAP = re.compile(r"^Sluice is up\. Bootstrap: (\S+)$")
PID = re.compile(r"^\s+(\S+)\s.*\bpid (\d+)")


@dataclass
class Up:
    """A running ``sluice up`` and what its banner said."""

    process: subprocess.Popen[str]
    data_dir: Path
    bootstrap: str = ""
    pids: dict[str, int] = field(default_factory=dict)
    stdout: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None

    def wait(self, timeout: float) -> int:
        """Wait for the exit and for the rest of its stdout."""
        code = self.process.wait(timeout)
        if self.pump is not None:
            self.pump.join(timeout)
        return code

    def stop(self, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.wait(timeout)
            raise

    def stderr(self) -> str:
        return (self.data_dir.parent / "up.stderr").read_text()


def start_up(data_dir: Path, *extra: str, timeout: float = 90) -> Up:
    stderr = (data_dir.parent / "up.stderr").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sluice",
            "up",
            "--port",
            "0",
            "--data-dir",
            str(data_dir),
            "--grace",
            "10",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=_env(),
        cwd=ROOT,
    )
    stderr.close()
    up = Up(proc, data_dir)
    banner_done = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            up.stdout.append(line)
            if m := BOOTSTRAP.match(line.rstrip("\n")):
                up.bootstrap = m.group(1)
            elif up.bootstrap and (m := PID.match(line)):
                up.pids[m.group(1)] = int(m.group(2))
            elif line.startswith("Logs:"):
                banner_done.set()
        proc.stdout.close()
        banner_done.set()

    up.pump = threading.Thread(target=pump, daemon=True)
    up.pump.start()
    if not banner_done.wait(timeout) or not up.bootstrap:
        proc.kill()
        up.wait(30)
        raise AssertionError(f"sluice up did not come up:\n{''.join(up.stdout)}\n{up.stderr()}")
    return up


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def children_of(pid: int) -> set[int]:
    """Direct children of ``pid``, from /proc (field 4 of /proc/<pid>/stat is the parent)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    stack = start_up(tmp_path_factory.mktemp("cli-up") / "data")
    try:
        yield stack
    finally:
        stack.stop()


def sluice(up: Up, *args: str, stdin: bytes = b"", timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "sluice", "--bootstrap", up.bootstrap, *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        env=_env(),
        cwd=ROOT,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[bytes]) -> str:
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


def json_lines(result: subprocess.CompletedProcess[bytes]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ok(result).splitlines()]


# ---- topics ----------------------------------------------------------------------------------


def test_topic_create_list_describe_delete(up: Up) -> None:
    out = ok(sluice(up, "topic", "create", "cli-life", "--partitions", "3", "--config", "retention_ms=1d"))
    assert out.startswith("Created topic cli-life with 3 partition(s)")
    assert "cli-life" in ok(sluice(up, "topic", "list")).splitlines()

    doc = json.loads(ok(sluice(up, "topic", "describe", "cli-life", "--format", "json")))
    assert doc["name"] == "cli-life"
    assert [p["partition"] for p in doc["partitions"]] == [0, 1, 2]
    assert all(p["log_start_offset"] == 0 and p["end_offset"] == 0 for p in doc["partitions"])
    assert doc["config"]["retention_ms"] == 86_400_000
    text = ok(sluice(up, "topic", "describe", "cli-life"))
    assert "Partitions: 3" in text
    assert "retention_ms=86400000" in text

    again = sluice(up, "topic", "create", "cli-life", "--partitions", "3")
    assert again.returncode == 1
    assert again.stderr.decode().startswith("error: TOPIC_ALREADY_EXISTS: ")

    assert ok(sluice(up, "topic", "delete", "cli-life")).startswith("Deleted topic cli-life")
    assert "cli-life" not in ok(sluice(up, "topic", "list")).splitlines()
    missing = sluice(up, "topic", "describe", "cli-life")
    assert missing.returncode == 1
    assert missing.stderr.decode().startswith("error: UNKNOWN_TOPIC_OR_PARTITION: ")


def test_bad_topic_name_is_a_typed_error(up: Up) -> None:
    for args in (["topic", "create", "bad name!"], ["topic", "describe", "a/b"]):
        result = sluice(up, *args)
        assert result.returncode == 1
        err = result.stderr.decode()
        assert err.startswith("error: INVALID_TOPIC: ")
        assert "[a-zA-Z0-9._-]" in err
        assert "Traceback" not in err


# ---- produce and consume ----------------------------------------------------------------------


def test_produce_then_consume_json_round_trip(up: Up) -> None:
    ok(sluice(up, "topic", "create", "cli-rt", "--partitions", "2"))
    lines = b"first\nsecond\n\n\xff\xfe binary\nno newline at end"
    produced = sluice(
        up, "produce", "cli-rt", "--key", "k1", "--tag", "red", "-H", "src=cli", "-H", "n=1", stdin=lines
    )
    assert produced.returncode == 0, produced.stderr.decode()
    assert "produced 5 message(s) to cli-rt" in produced.stderr.decode()

    records = json_lines(
        sluice(up, "consume", "cli-rt", "--from", "earliest", "--max", "5", "--format", "json")
    )
    # One key: one partition, offsets dense and in send order.
    assert len({r["partition"] for r in records}) == 1
    assert [r["offset"] for r in records] == [0, 1, 2, 3, 4]
    assert [r["value"] for r in records] == [
        "first",
        "second",
        "",
        {"base64": base64.b64encode(b"\xff\xfe binary").decode()},
        "no newline at end",
    ]
    for r in records:
        assert r["topic"] == "cli-rt"
        assert r["key"] == "k1"
        assert r["tag"] == "red"
        assert r["headers"] == {"src": "cli", "n": "1"}
        assert isinstance(r["timestamp"], int)
        assert r["timestamp"] > 1_600_000_000_000

    values = sluice(up, "consume", "cli-rt", "--from", "earliest", "--max", "2")
    assert ok(values) == "first\nsecond\n"


def test_filter_returns_only_matching_tags(up: Up) -> None:
    ok(sluice(up, "topic", "create", "cli-filter", "--partitions", "2"))
    ok(sluice(up, "produce", "cli-filter", "--tag", "red", stdin=b"r1\nr2\nr3\n"))
    ok(sluice(up, "produce", "cli-filter", "--tag", "blue", stdin=b"b1\nb2\n"))
    ok(sluice(up, "produce", "cli-filter", stdin=b"untagged\n"))

    # Idle exit instead of --max: proves nothing else matching is there.
    red = json_lines(
        sluice(
            up,
            "consume",
            "cli-filter",
            "--from",
            "earliest",
            "--filter",
            "red",
            "--timeout",
            "1.5",
            "-f",
            "json",
        )
    )
    assert sorted(r["value"] for r in red) == ["r1", "r2", "r3"]
    assert {r["tag"] for r in red} == {"red"}

    both = ok(
        sluice(
            up, "consume", "cli-filter", "--from", "earliest", "--filter", "red || blue", "--timeout", "1.5"
        )
    )
    assert sorted(both.split()) == ["b1", "b2", "r1", "r2", "r3"]

    everything = ok(sluice(up, "consume", "cli-filter", "--from", "earliest", "--timeout", "1.5"))
    assert sorted(everything.split()) == ["b1", "b2", "r1", "r2", "r3", "untagged"]


def test_consume_from_latest_sees_only_new_records(up: Up) -> None:
    ok(sluice(up, "topic", "create", "cli-latest", "--partitions", "1"))
    ok(sluice(up, "produce", "cli-latest", stdin=b"old\n"))
    # Start a follower from latest, then produce once it is positioned.
    follower = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sluice",
            "-b",
            up.bootstrap,
            "consume",
            "cli-latest",
            "--from",
            "latest",
            "--max",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
        cwd=ROOT,
    )
    try:
        # Resending until it is seen avoids guessing when the follower took its position.
        for _ in range(40):
            ok(sluice(up, "produce", "cli-latest", "-q", stdin=b"new\n"))
            try:
                out, err = follower.communicate(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            pytest.fail("the --from latest consumer never saw a new record")
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, err.decode()
    assert out == b"new\n"


def test_ctrl_c_ends_a_following_consume_cleanly(up: Up) -> None:
    ok(sluice(up, "topic", "create", "cli-follow"))
    ok(sluice(up, "produce", "cli-follow", "-q", stdin=b"x\n"))
    follower = subprocess.Popen(
        [sys.executable, "-m", "sluice", "-b", up.bootstrap, "consume", "cli-follow", "--from", "earliest"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
        cwd=ROOT,
    )
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == b"x\n"  # it is fetching: now interrupt it
        follower.send_signal(signal.SIGINT)
        _, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 130
    assert b"Traceback" not in err


def test_unknown_topic_errors(up: Up) -> None:
    consumed = sluice(up, "consume", "cli-nope", "--from", "earliest", "--max", "1")
    assert consumed.returncode == 1
    assert consumed.stderr.decode().startswith("error: UNKNOWN_TOPIC_OR_PARTITION: ")
    produced = sluice(up, "produce", "cli-nope", stdin=b"x\n")
    assert produced.returncode == 1
    assert "UNKNOWN_TOPIC_OR_PARTITION" in produced.stderr.decode()
    assert "Traceback" not in produced.stderr.decode()


# ---- stopping ----------------------------------------------------------------------------------


def test_sigterm_stops_every_service_and_redis(tmp_path: Path) -> None:
    stack = start_up(tmp_path / "data")
    try:
        assert {"redis", "coordinator", "broker"} <= set(stack.pids)
        # The banner names the data-plane (wire) ports of the broker and the dispatcher.
        banner = {line.split()[0]: line for line in stack.stdout if line.startswith("  ")}
        assert re.search(r" wire 127\.0\.0\.1:\d+$", banner["broker"].rstrip()), banner["broker"]
        if "dispatcher" in banner:
            assert " wire " in banner["dispatcher"]
        assert " wire " not in banner["coordinator"]
        # Its Redis answers a write only once it is fsynced (docs/offset-store.md, "Durability").
        redis_url = banner["redis"].split()[1]
        with redis.Redis.from_url(redis_url) as r:
            config = r.config_get("append*")
            assert (config["appendonly"], config["appendfsync"]) == ("yes", "always")
        # One Python process runs every service (the combined mode); its only child is its Redis.
        services = {name: pid for name, pid in stack.pids.items() if name != "redis"}
        assert set(services.values()) == {stack.process.pid}, stack.pids
        assert children_of(stack.process.pid) == {stack.pids["redis"]}
        assert stack.stop() == 0
    finally:
        if stack.process.poll() is None:
            stack.process.kill()
            stack.wait(30)
    assert all(gone(pid) for pid in stack.pids.values()), stack.pids
    assert "Sluice stopped." in "".join(stack.stdout)
    logs = stack.data_dir / "logs"
    assert "SLUICE_READY service=broker" in (logs / "broker.log").read_text()
    assert "SLUICE_STOPPED service=broker" in (logs / "broker.log").read_text()
    assert (stack.data_dir / "redis").is_dir()


def test_a_service_that_dies_stops_everything(tmp_path: Path) -> None:
    """``--processes separate``: a process per service; one killed, everything stops (exit 1). The combined
    mode's crash is tests/unit/cli/test_cli_up_combined.py's."""
    with run_redis() as redis:
        stack = start_up(tmp_path / "data", "--redis-url", redis.url, "--processes", "separate")
        try:
            assert "redis" not in stack.pids  # an external Redis is used, not started
            assert f"{redis.url}  (external)" in "".join(stack.stdout)
            # Every service is a direct child of its own, and it started nothing else.
            assert set(stack.pids.values()) == children_of(stack.process.pid)
            assert len(set(stack.pids.values())) == len(stack.pids) >= 2
            os.kill(stack.pids["broker"], signal.SIGKILL)
            assert stack.wait(60) == 1
        finally:
            if stack.process.poll() is None:
                stack.process.kill()
                stack.wait(30)
        assert all(gone(pid) for pid in stack.pids.values()), stack.pids
        assert redis.process.poll() is None  # not ours to stop
    err = stack.stderr()
    assert err.startswith("error: SERVICE_DIED: broker exited unexpectedly with code -9")
    assert "SLUICE_READY service=broker" in err  # its last log lines are shown


def test_kill_9_of_the_combined_process_loses_no_ack_and_leaves_no_orphan(tmp_path: Path) -> None:
    """The combined mode's crash: its Redis dies with it (no orphan), and a new ``sluice up`` on the same
    data serves what the killed one acknowledged."""
    stack = start_up(tmp_path / "data")
    try:
        ok(sluice(stack, "topic", "create", "cli-crash", "--partitions", "1"))
        ok(sluice(stack, "produce", "cli-crash", stdin=b"acked\n"))
        redis_pid = stack.pids["redis"]
        # Readable once it exited (a zombie until its new parent reaps it): waited on, not polled.
        pidfd = os.pidfd_open(redis_pid)
        stack.process.kill()
        stack.wait(30)
        try:
            assert select.select([pidfd], [], [], 30)[0], f"redis-server {redis_pid} outlived sluice up"
        finally:
            os.close(pidfd)
    finally:
        if stack.process.poll() is None:
            stack.process.kill()
            stack.wait(30)
    again = start_up(tmp_path / "data")
    try:
        consumed = sluice(again, "consume", "cli-crash", "--from", "earliest", "--max", "1", timeout=90)
        assert ok(consumed) == "acked\n"
        assert again.stop() == 0
    finally:
        if again.process.poll() is None:
            again.process.kill()
            again.wait(30)


def test_with_restart_a_killed_broker_comes_back_on_its_ports_with_its_data(tmp_path: Path) -> None:
    """``sluice up --restart``: kill -9 the broker; it is started again (as Kubernetes would), on the port
    clients know, and serves what it acknowledged before."""
    stack = start_up(tmp_path / "data", "--restart")
    try:
        ok(sluice(stack, "topic", "create", "cli-restart", "--partitions", "1"))
        ok(sluice(stack, "produce", "cli-restart", stdin=b"before\n"))
        old_pid = stack.pids["broker"]
        os.kill(old_pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        restarted = re.compile(r"^sluice up: broker restarted \(pid (\d+), restart 1\)$")
        new_pid = 0
        while not new_pid:
            assert time.monotonic() < deadline, "".join(stack.stdout)
            assert stack.process.poll() is None, stack.stderr()
            for line in stack.stdout:
                if m := restarted.match(line.rstrip("\n")):
                    new_pid = int(m.group(1))
            time.sleep(0.1)
        assert new_pid != old_pid
        assert any("broker exited with code -9" in line for line in stack.stdout)
        # The producer retries until the restarted broker serves again; then both records are there.
        ok(sluice(stack, "produce", "cli-restart", stdin=b"after\n", timeout=90))
        consumed = sluice(stack, "consume", "cli-restart", "--from", "earliest", "--max", "2", timeout=90)
        assert ok(consumed) == "before\nafter\n"
        assert stack.stop() == 0
    finally:
        if stack.process.poll() is None:
            stack.process.kill()
            stack.wait(30)


# ---- process limits ----------------------------------------------------------------------------


def test_up_and_every_service_raise_the_open_files_limit_to_the_hard_one(up: Up) -> None:
    # The raise itself is tested from a lowered soft limit in tests/unit/test_server_limits.py and
    # tests/integration/broker/test_descriptors.py; here: every process of `sluice up` goes through it.
    assert any(line.startswith("Open files limit: soft ") for line in up.stdout)
    services = {name: pid for name, pid in up.pids.items() if name != "redis"}
    assert {"coordinator", "broker"} <= set(services)
    for name, pid in services.items():
        assert "open files limit: soft" in (up.data_dir / "logs" / f"{name}.log").read_text(), name
        limits = Path(f"/proc/{pid}/limits").read_text()
        m = re.search(r"^Max open files\s+(\d+)\s+(\d+)", limits, re.MULTILINE)
        assert m, limits
        assert m.group(1) == m.group(2), f"{name}: {m.group(0)}"
