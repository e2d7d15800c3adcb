"""``sluice dlq`` for push subscriptions: what is refused before any connection, and the names
(docs/retry.md, "Redrive of push subscriptions")."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.cli import commands
from sluice.retry.levels import redrive_topic, sub_dlq_topic

NAME = st.from_regex(r"[a-zA-Z0-9._-]{1,40}", fullmatch=True)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = commands.main(["--bootstrap", "127.0.0.1:1", "dlq", *argv])
    return code, capsys.readouterr().err


def test_subscription_needs_its_topic(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "redrive", "--subscription", "s")
    assert (code, "--subscription needs --topic" in err) == (2, True)
    code, err = run(capsys, "peek", "--group", "g", "--topic", "t")
    assert (code, "--topic goes with --subscription only" in err) == (2, True)


def test_target_of_the_other_kind_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "redrive", "--subscription", "s", "--topic", "t", "--to", "retry")
    assert (code, "--to must be redelivery or original for t.s.DLQ" in err) == (1, True)
    code, err = run(capsys, "redrive", "--group", "g", "--to", "redelivery")
    assert (code, "--to must be retry or original for DLQ.g" in err) == (1, True)


def test_original_asks_and_without_a_terminal_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    code, err = run(capsys, "redrive", "--subscription", "s", "--topic", "t", "--to", "original")
    assert code == 2
    assert "EVERY group and subscription" in err
    assert "--yes" in err


def test_too_long_redrive_topic_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "redrive", "--subscription", "s", "--topic", "t" * 240)
    assert (code, "(limit 249)" in err) == (1, True)


@given(topic=NAME, sub=NAME)
def test_redriven_records_fail_back_to_their_dlq(topic: str, sub: str) -> None:
    assert sub_dlq_topic(redrive_topic(topic, sub), sub) == sub_dlq_topic(topic, sub)
    assert redrive_topic(topic, sub) != sub_dlq_topic(topic, sub)
