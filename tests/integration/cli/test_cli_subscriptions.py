"""``sluice subscription list|describe|reset|skip|delete|peek`` against a real ``sluice up`` stack.

The dispatcher of this stack unloads an idle subscription after 300 ms (not 30 s) and re-reads the
registry every 200 ms, through its ``SLUICE_DISPATCHER_*`` environment, so "long idle" is seconds.
Consumers are the SDK's push consumer or ``sluice consume --subscription`` processes.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from sluice import Client
from sluice.client.push import PushConsumer
from sluice.errors import RequestTimedOut, UnknownSubscription
from tests.integration.cli.test_cli_system import Up, ok, sluice, start_up

LINGER_S = 0.3
PREFIX = "sluice"


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SLUICE_DISPATCHER_IDLE_SUBSCRIPTION_LINGER", f"{int(LINGER_S * 1000)}ms")
        env.setenv("SLUICE_DISPATCHER_SUBSCRIPTION_REFRESH_INTERVAL", "200ms")
        env.setenv("SLUICE_DISPATCHER_CURSOR_FLUSH_INTERVAL", "50ms")
        stack = start_up(tmp_path_factory.mktemp("cli-subs") / "data")
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def client(up: Up) -> Iterator[Client]:
    with Client(up.bootstrap, request_timeout=10) as c:
        yield c


def banner_url(up: Up, service: str, pattern: str) -> str:
    for line in up.stdout:
        if line.split()[:1] == [service] and (m := re.search(pattern, line)):
            return m.group(1)
    raise AssertionError(f"no {service} address in the banner:\n{''.join(up.stdout)}")


def backlog_gauge(up: Up, topic: str, subscription: str) -> float | None:
    url = banner_url(up, "dispatcher", r"metrics (http://\S+)")
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    wanted = f'sluice_dispatcher_backlog{{subscription="{subscription}",topic="{topic}"}} '
    for line in text.splitlines():
        if line.startswith(wanted):
            return float(line.split()[-1])
    return None


def run_json(up: Up, *args: str) -> Any:
    return json.loads(ok(sluice(up, *args, "--format", "json")))


def listed(up: Up, topic: str) -> dict[str, dict[str, Any]]:
    return {s["subscription"]: s for s in run_json(up, "subscription", "list", topic)}


def wait_for(pred: Callable[[], bool], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def fails(up: Up, code: str, *args: str) -> str:
    result = sluice(up, *args)
    err = result.stderr.decode()
    assert result.returncode == 1, (result.returncode, err)
    assert err.startswith(f"error: {code}: "), err
    assert "Traceback" not in err
    return err


def peek(up: Up, topic: str, subscription: str, n: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = run_json(up, "subscription", "peek", topic, subscription, "-n", str(n))
    return rows


def consume(up: Up, topic: str, subscription: str, n: int) -> list[str]:
    args = ["--subscription", subscription, "--type", "shared", "--from", "earliest", "--receiver-queue", "0"]
    return ok(sluice(up, "consume", topic, *args, "--max", str(n))).split()


def receive_until_failed(pc: PushConsumer, timeout: float = 10) -> None:
    """Receive until the consumer fails (its typed error is raised); bounded by ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(RequestTimedOut):
            pc.receive(timeout=0.5)
    raise AssertionError(f"the consumer did not fail within {timeout} s")


# ---- idle subscriptions ------------------------------------------------------------------------


def test_an_idle_durable_subscription_stays_listed_with_a_growing_backlog(up: Up) -> None:
    ok(sluice(up, "topic", "create", "subs-idle", "--partitions", "2"))
    ok(sluice(up, "produce", "subs-idle", "-q", stdin=b"".join(b"v%d\n" % i for i in range(10))))
    assert len(consume(up, "subs-idle", "keep", 4)) == 4  # acks 4 of 10, then leaves
    left_at = int(time.time() * 1000)

    time.sleep(10 * LINGER_S)  # the linger is long over: the dispatcher unloaded it
    keep = listed(up, "subs-idle")["keep"]
    assert (keep["consumers"], keep["backlog"], keep["durable"], keep["type"]) == (0, 6, True, "shared")
    last_active = datetime.fromisoformat(keep["last_active"]).timestamp() * 1000
    assert left_at - 5000 <= last_active <= left_at + 1000
    assert backlog_gauge(up, "subs-idle", "keep") == 6

    ok(sluice(up, "produce", "subs-idle", "-q", stdin=b"w1\nw2\nw3\n"))
    wait_for(lambda: backlog_gauge(up, "subs-idle", "keep") == 9, "the gauge to count records produced idle")
    assert listed(up, "subs-idle")["keep"]["backlog"] == 9
    doc = run_json(up, "subscription", "describe", "subs-idle", "keep")
    assert (doc["backlog"], doc["consumers"]) == (9, [])
    assert "Backlog:      9" in ok(sluice(up, "subscription", "describe", "subs-idle", "keep"))


# ---- peek, skip, reset -------------------------------------------------------------------------


def test_peek_skip_and_reset(up: Up) -> None:
    topic = "subs-move"
    ok(sluice(up, "topic", "create", topic))
    ok(sluice(up, "produce", topic, "-q", stdin=b"a0\na1\na2\na3\na4\n"))
    time.sleep(0.05)  # the b records are produced strictly later (a distinct timestamp)
    ok(sluice(up, "produce", topic, "-q", stdin=b"b0\nb1\nb2\nb3\nb4\n"))
    assert consume(up, topic, "s", 2) == ["a0", "a1"]

    # Peek shows the next ones and moves nothing.
    first = peek(up, topic, "s", 3)
    assert [(m["offset"], m["value"]) for m in first] == [(2, "a2"), (3, "a3"), (4, "a4")]
    assert peek(up, topic, "s", 3) == first
    assert listed(up, topic)["s"]["backlog"] == 8
    text = ok(sluice(up, "subscription", "peek", topic, "s", "-n", "1"))
    assert text.startswith("0/2  ")
    assert text.rstrip().endswith("a2")

    # Skip acknowledges exactly what peek showed.
    skipped = run_json(up, "subscription", "skip", topic, "s", "--count", "3")
    assert [(x["partition"], x["offset"]) for x in skipped["skipped"]] == [(0, 2), (0, 3), (0, 4)]
    assert skipped["partitions"] == [{"partition": 0, "before": 2, "after": 5, "note": None}]
    assert [m["value"] for m in peek(up, topic, "s", 2)] == ["b0", "b1"]
    assert listed(up, topic)["s"]["backlog"] == 5

    # Reset to earliest: everything is unacknowledged again.
    reset = run_json(up, "subscription", "reset", topic, "s", "--to", "earliest")
    assert reset["partitions"] == [{"partition": 0, "before": 5, "after": 0, "note": None}]
    assert [m["value"] for m in peek(up, topic, "s", 1)] == ["a0"]
    assert listed(up, topic)["s"]["backlog"] == 10

    # Past the log end: clamped, and said so.
    clamped = run_json(up, "subscription", "reset", topic, "s", "--to", "999")
    (p0,) = clamped["partitions"]
    assert (p0["after"], p0["note"]) == (10, "offset 999 is past the log end 10: clamped to the log end")
    assert "clamped to the log end" in ok(sluice(up, "subscription", "reset", topic, "s", "--to", "999"))
    assert peek(up, topic, "s", 1) == []
    assert listed(up, topic)["s"]["backlog"] == 0

    # To a time: the first record at or after it.
    ok(sluice(up, "subscription", "reset", topic, "s", "--to", "earliest"))
    b0_ms = next(m for m in peek(up, topic, "s", 10) if m["value"] == "b0")["timestamp"]
    when = datetime.fromtimestamp(b0_ms / 1000, UTC).isoformat(timespec="milliseconds")
    at_time = run_json(up, "subscription", "reset", topic, "s", "--to", when)
    assert at_time["partitions"][0]["after"] == 5
    assert [m["value"] for m in peek(up, topic, "s", 1)] == ["b0"]
    assert consume(up, topic, "s", 1) == ["b0"], "consumers resume at the reset position"

    # Bad input: typed errors, and nothing moved.
    err = fails(up, "INVALID_ARGUMENT", "subscription", "reset", topic, "s", "--to", "2999-01-01T00:00:00Z")
    assert "in the future" in err
    err = fails(up, "INVALID_ARGUMENT", "subscription", "reset", topic, "s", "--to", "yesterday")
    assert "'yesterday'" in err
    assert [m["value"] for m in peek(up, topic, "s", 1)] == ["b1"]
    fails(up, "UNKNOWN_SUBSCRIPTION", "subscription", "peek", topic, "nope", "-n", "1")
    fails(up, "UNKNOWN_SUBSCRIPTION", "subscription", "skip", topic, "nope", "--count", "1")
    fails(up, "UNKNOWN_SUBSCRIPTION", "subscription", "reset", topic, "nope", "--to", "earliest")
    fails(up, "UNKNOWN_TOPIC_OR_PARTITION", "subscription", "reset", "subs-no-topic", "s", "--to", "earliest")
    fails(up, "INVALID_ARGUMENT", "subscription", "skip", topic, "s", "--count", "0")


# ---- delete ------------------------------------------------------------------------------------


def test_delete_is_refused_while_consumers_are_connected_unless_forced(up: Up, client: Client) -> None:
    topic = "subs-del"
    ok(sluice(up, "topic", "create", topic))
    ok(sluice(up, "produce", topic, "-q", stdin=b"x0\nx1\nx2\n"))
    store = redis.Redis.from_url(banner_url(up, "redis", r"(redis://\S+)"))
    try:
        with client.push_consumer(topic, "busy", "shared", initial_position="earliest") as pc:
            first = pc.receive(timeout=10)
            pc.ack(first)
            err = fails(up, "SUBSCRIPTION_IN_USE", "subscription", "delete", topic, "busy")
            assert "1 consumer(s) connected" in err
            fails(up, "SUBSCRIPTION_IN_USE", "subscription", "reset", topic, "busy", "--to", "latest")
            fails(up, "SUBSCRIPTION_IN_USE", "subscription", "skip", topic, "busy", "--count", "1")
            assert listed(up, topic)["busy"]["consumers"] == 1

            forced = run_json(up, "subscription", "delete", topic, "busy", "--force")
            assert (forced["disconnected"], forced["partitions"]) == (1, [0])
            with pytest.raises(UnknownSubscription, match="deleted by an operator"):
                receive_until_failed(pc)
        assert "busy" not in listed(up, topic)
        fails(up, "UNKNOWN_SUBSCRIPTION", "subscription", "describe", topic, "busy")
        fails(up, "UNKNOWN_SUBSCRIPTION", "subscription", "delete", topic, "busy")
        assert store.keys(f"{PREFIX}:cur:{{busy}}:*") == []
        assert store.hget(f"{PREFIX}:subs", f"{topic}/busy") is None

        # An idle one is deleted without --force; re-created, it starts clean (from earliest).
        assert consume(up, topic, "idle", 2) == ["x0", "x1"]
        wait_for(lambda: store.keys(f"{PREFIX}:cur:{{idle}}:*") != [], "the cursor flush (every 50 ms)")
        deleted = ok(sluice(up, "subscription", "delete", topic, "idle"))
        assert "Deleted subscription subs-del/idle." in deleted
        assert store.keys(f"{PREFIX}:cur:{{idle}}:*") == []
        assert "idle" not in listed(up, topic)
        assert consume(up, topic, "idle", 3) == ["x0", "x1", "x2"]
    finally:
        store.close()


def test_peek_of_a_live_subscription_shows_in_flight_messages(up: Up, client: Client) -> None:
    topic = "subs-live"
    ok(sluice(up, "topic", "create", topic))
    ok(sluice(up, "produce", topic, "-q", stdin=b"y0\ny1\ny2\n"))
    with client.push_consumer(
        topic, "live", "shared", initial_position="earliest", receiver_queue_size=0
    ) as pc:
        held = pc.receive(timeout=10)  # delivered, not acknowledged
        assert held.value == b"y0"
        shown = peek(up, topic, "live", 5)
        assert [m["value"] for m in shown] == ["y0", "y1", "y2"]
        pc.ack(held)
        wait_for(lambda: [m["value"] for m in peek(up, topic, "live", 5)] == ["y1", "y2"], "the ack to show")
