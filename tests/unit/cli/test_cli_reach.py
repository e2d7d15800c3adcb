"""The first minutes (issue 18), what needs no cluster: ``sluice up --help`` names the wire ports (so a
``--metrics-port`` is not put on one), and a bootstrap address that does not answer is announced at once,
naming the address and how long the command will wait, instead of 30 s of silence.
(tests/integration/cli/test_first_minutes.py has the refused address and the wrong service's port.)"""

from __future__ import annotations

import io
import socket
import time
from collections.abc import Iterator

import pytest

from sluice.cli import commands, reach


def test_up_help_names_the_wire_ports(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        commands.main(["up", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert "wire ports" in text
    assert "broker +11" in text
    assert "dispatcher +13" in text
    assert "must not fall on any port above" in text  # what --metrics-port must avoid


@pytest.fixture
def silent_address() -> Iterator[str]:
    """A loopback port whose accept queue is full: Linux drops further SYNs, so a connect neither
    succeeds nor is refused (a firewall that drops packets, as seen from the client)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    address = server.getsockname()
    filled = []
    try:
        for _ in range(8):  # the queue takes backlog + 1; the rest wait in SYN-SENT
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(address)
            filled.append(c)
        time.sleep(0.2)
        yield f"{address[0]}:{address[1]}"
    finally:
        for c in filled:
            c.close()
        server.close()


def test_an_address_that_does_not_answer_is_announced_with_what_and_how_long(
    silent_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reach, "PROBE_SECONDS", 0.5)
    err = io.StringIO()
    started = time.monotonic()
    reach.preflight(silent_address, request_timeout=30, err=err)  # says so, then lets the SDK wait
    assert time.monotonic() - started < 5
    assert err.getvalue().startswith(f"connecting to the coordinator at {silent_address} ")
    assert "waiting up to 30 s, --request-timeout" in err.getvalue()


def test_an_address_that_answers_is_not_announced() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        host, port = server.getsockname()
        err = io.StringIO()
        reach.preflight(f"{host}:{port}", request_timeout=30, err=err)
        assert err.getvalue() == ""
