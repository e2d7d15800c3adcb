"""The JSON output rule (UTF-8 text or {"base64": ...}), record lines and KEY=VALUE parsing."""

from __future__ import annotations

import argparse
import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.cli.errors import UsageError
from sluice.cli.output import (
    bytes_to_json,
    collect_pairs,
    format_record,
    json_to_bytes,
    key_value,
    record_to_dict,
)
from sluice.codec.batch import Record


def make_record(**kw: Any) -> Record:
    fields: dict[str, Any] = {
        "topic": "orders",
        "partition": 2,
        "offset": 41,
        "key": b"k1",
        "value": b"hello",
        "tag": "tagA",
        "headers": {"h": b"x"},
        "timestamp": 1_700_000_000_123,
    }
    fields.update(kw)
    return Record(**fields)


def test_utf8_bytes_print_as_text() -> None:
    assert bytes_to_json(b"plain") == "plain"
    assert bytes_to_json("h\u00e9llo \u2603".encode()) == "h\u00e9llo \u2603"
    assert bytes_to_json(b"") == ""


def test_non_utf8_bytes_print_as_base64_object() -> None:
    raw = b"\xff\x00\xfe"
    assert bytes_to_json(raw) == {"base64": base64.b64encode(raw).decode()}


def test_none_prints_as_null() -> None:
    assert bytes_to_json(None) is None
    assert json_to_bytes(None) is None


@given(st.binary(max_size=64))
def test_json_rule_round_trips_any_bytes(raw: bytes) -> None:
    encoded = json.loads(json.dumps(bytes_to_json(raw)))
    assert json_to_bytes(encoded) == raw


def test_json_line_has_every_field() -> None:
    line = format_record(make_record(), "json")
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert json.loads(line) == {
        "topic": "orders",
        "partition": 2,
        "offset": 41,
        "timestamp": 1_700_000_000_123,
        "key": "k1",
        "tag": "tagA",
        "headers": {"h": "x"},
        "value": "hello",
    }


def test_json_line_marks_binary_value_key_and_header() -> None:
    rec = make_record(key=b"\x80", value=b"\xc3\x28", headers={"bin": b"\xff", "txt": b"ok"}, tag=None)
    doc = record_to_dict(rec)
    assert doc["key"] == {"base64": "gA=="}
    assert doc["value"] == {"base64": base64.b64encode(b"\xc3\x28").decode()}
    assert doc["headers"] == {"bin": {"base64": "/w=="}, "txt": "ok"}
    assert doc["tag"] is None


def test_json_keeps_non_ascii_text_readable() -> None:
    line = format_record(make_record(value="caf\u00e9".encode()), "json")
    assert "caf\u00e9".encode() in line


def test_value_format_is_the_raw_value_and_a_newline() -> None:
    assert format_record(make_record(value=b"\xff\x00raw"), "value") == b"\xff\x00raw\n"
    assert format_record(make_record(value=b""), "value") == b"\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=b", ("a", "b")),
        ("a=", ("a", "")),
        ("url=http://x/?q=1", ("url", "http://x/?q=1")),
        (" k =v", ("k", "v")),
    ],
)
def test_key_value_parses(text: str, expected: tuple[str, str]) -> None:
    assert key_value(text) == expected


@pytest.mark.parametrize("text", ["novalue", "=v", "", " =v"])
def test_key_value_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
        key_value(text)


def test_collect_pairs_builds_a_dict_and_refuses_duplicates() -> None:
    assert collect_pairs([("a", "1"), ("b", "2")], "--header") == {"a": "1", "b": "2"}
    assert collect_pairs(None, "--header") == {}
    with pytest.raises(UsageError, match="'a' given twice"):
        collect_pairs([("a", "1"), ("a", "2")], "--header")
