"""``sluice up --tls``: a private CA in ``<data-dir>/tls``, TLS on every service, and a banner that says
how to connect; the CLI (flags and environment) and the SDK connect with the CA, plaintext does not."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice import Client, TLSConfig
from tests.harness import ROOT, _env
from tests.integration.cli.test_cli_system import Up, start_up

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    stack = start_up(tmp_path_factory.mktemp("up-tls") / "data", "--tls")
    try:
        yield stack
    finally:
        stack.stop()


def _cli(
    up: Up, *args: str, env: dict[str, str] | None = None, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "sluice", "--bootstrap", up.bootstrap, *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        env={**_env(), **(env or {})},
        cwd=ROOT,
        check=False,
    )


def test_the_banner_names_the_ca_and_the_files_exist(up: Up) -> None:
    ca = up.data_dir.resolve() / "tls" / "ca.crt"
    assert f"export SLUICE_TLS_CA={ca}\n" in "".join(up.stdout)
    assert ca.is_file()
    assert oct((up.data_dir / "tls" / "ca.key").stat().st_mode & 0o777) == "0o600"


def test_the_cli_with_the_ca_produces_and_consumes_and_plaintext_is_refused(up: Up) -> None:
    ca = str(up.data_dir.resolve() / "tls" / "ca.crt")
    created = _cli(up, "--tls-ca", ca, "topic", "create", "up-tls", "--partitions", "1")
    assert created.returncode == 0, created.stderr.decode()
    produced = _cli(up, "produce", "up-tls", env={"SLUICE_TLS_CA": ca}, stdin=b"one\ntwo\n")
    assert produced.returncode == 0, produced.stderr.decode()
    consumed = _cli(up, "consume", "up-tls", "--from", "earliest", "--max", "2", env={"SLUICE_TLS_CA": ca})
    assert consumed.returncode == 0, consumed.stderr.decode()
    assert consumed.stdout.decode().split() == ["one", "two"]
    plain = _cli(up, "--request-timeout", "2", "topic", "list", env={"SLUICE_TLS_CA": ""})
    assert plain.returncode == 1
    assert plain.stderr.decode().startswith("error:")
    assert "Traceback" not in plain.stderr.decode()


def test_the_sdk_with_the_ca_produces_and_group_consumes(up: Up) -> None:
    tls = TLSConfig(ca=Path(up.data_dir) / "tls" / "ca.crt")
    with Client(up.bootstrap, request_timeout=10, tls=tls) as client:
        client.admin.create_topic("up-tls-sdk", partitions=2)
        with client.producer("up-tls-sdk", partitioner="round_robin") as producer:
            for i in range(10):
                producer.send(str(i).encode())
        consumer = client.consumer("up-tls-g", ["up-tls-sdk"], auto_offset_reset="earliest")
        got: list[bytes] = []
        for _ in range(150):  # 30 s at most
            got += [r.value for r in consumer.poll(0.2)]
            if len(got) >= 10:
                break
        consumer.close()
    assert sorted(int(v) for v in got) == list(range(10))
