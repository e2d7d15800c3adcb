"""The SDK works without the optional extras: nothing imports fastavro or opentelemetry until a feature
that needs it is used, and then the error names the extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sluice.client.producer import ProducerConfig
from sluice.errors import SerdeExtraMissing
from sluice.serde.tracing import SendTracer, extract_context

SERVICES = Path(__file__).resolve().parents[3] / "services"

_WITHOUT = """
import sys
sys.modules["fastavro"] = None  # an environment without the extras
sys.modules["opentelemetry"] = None
import sluice.client, sluice.serde, sluice.serde.avro, sluice.serde.tracing, sluice.serde.protobuf
from sluice import Client
from sluice.client.push.serde_message import message_kinds
assert message_kinds(None, "json") is not None
print("ok")
"""


def test_the_sdk_imports_without_fastavro_and_opentelemetry() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT],
        env={"PYTHONPATH": str(SERVICES)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_tracing_without_opentelemetry_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    assert ProducerConfig(tracing=True).tracing  # the option itself needs nothing
    with pytest.raises(SerdeExtraMissing, match=r"pip install 'sluice\[otel\]'"):
        SendTracer("orders")
    with pytest.raises(SerdeExtraMissing):
        extract_context({"traceparent": b"00-0-0-01"})
