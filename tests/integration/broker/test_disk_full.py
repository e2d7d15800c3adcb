"""Disk full on a real broker process, on a real (size-limited tmpfs) filesystem.

The must-show of issue 16: produce fails typed (STORAGE_FULL) before the disk is full, fetch keeps
working, produce resumes in the same process once space is freed, no acknowledged record is lost (each
one is read back by offset and value) and ``sluice broker verify`` passes. A second test switches the
guard off so appends run into the real ENOSPC: the broker cuts the failed append back and goes on.

Needs ``mount -t tmpfs`` (root, or a user namespace that allows it); skipped with the reason otherwise.
The seam-based tests (ENOSPC injected per file kind) are tests/unit/broker_log/test_disk_full_seam.py.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sluice.client import Client
from sluice.v1 import common_pb2
from tests.harness import ROOT, run_redis, start_service

from .conftest import Broker, make_batch, records, start_broker

MiB = 1024 * 1024
TMPFS_BYTES = 64 * MiB
RECORDS_PER_BATCH = 32
VALUE_BYTES = 1024
#: Bounds every produce loop: far more than the 64 MiB filesystem can take.
MAX_PRODUCES = 4000


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs mounted at a fresh directory, unmounted afterwards."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        run = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mnt)],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"a size-limited tmpfs is needed for a real disk-full test; mount failed: {exc}")
    if run.returncode != 0:
        pytest.skip(
            "a size-limited tmpfs is needed for a real disk-full test (root or CAP_SYS_ADMIN); "
            f"mount failed: {run.stderr.decode().strip()}"
        )
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def _ballast(path: Path, nbytes: int) -> None:
    """Another writer on the same filesystem: the space an operator frees later."""
    with open(path, "wb") as f:
        chunk = b"\xab" * MiB
        for _ in range(nbytes // MiB):
            f.write(chunk)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class Ledger:
    """Every acknowledged record, by offset."""

    def __init__(self) -> None:
        self.acked: dict[int, bytes] = {}
        self.seq = 0

    def produce(self, broker: Broker, topic: str) -> int:
        """One produce of a new batch; returns its error code (NONE: acknowledged, recorded)."""
        values = [f"s{self.seq}-r{i}-".encode().ljust(VALUE_BYTES, b".") for i in range(RECORDS_PER_BATCH)]
        self.seq += 1
        r = broker.produce(topic, 0, make_batch(values), acks=-1)
        if r.error.code == common_pb2.NONE:
            for i, v in enumerate(values):
                self.acked[r.base_offset + i] = v
        return int(r.error.code)

    def fill(self, broker: Broker, topic: str) -> tuple[int, str]:
        """Produce until refused; returns (error code, message) of the refusal."""
        for _ in range(MAX_PRODUCES):
            values = [
                f"s{self.seq}-r{i}-".encode().ljust(VALUE_BYTES, b".") for i in range(RECORDS_PER_BATCH)
            ]
            self.seq += 1
            r = broker.produce(topic, 0, make_batch(values), acks=-1)
            if r.error.code != common_pb2.NONE:
                return int(r.error.code), r.error.message
            for i, v in enumerate(values):
                self.acked[r.base_offset + i] = v
        raise AssertionError(f"{MAX_PRODUCES} produces were all acknowledged on a {TMPFS_BYTES} byte disk")

    def read_back(self, broker: Broker, topic: str) -> None:
        """Fetch the whole log: every acknowledged record is there, at its offset, with its value."""
        got: dict[int, bytes] = {}
        offset = 0
        end = max(self.acked) + 1
        deadline = time.monotonic() + 60
        while offset < end and time.monotonic() < deadline:
            part = broker.fetch_one(topic, offset, max_bytes=4 * MiB, partition_max_bytes=4 * MiB)
            assert part.error.code == common_pb2.NONE, part.error.message
            recs = records(part, offset)
            assert recs, f"no progress reading at offset {offset}"
            for rec in recs:
                got[rec.offset] = rec.value
            offset = recs[-1].offset + 1
        lost = [o for o, v in self.acked.items() if got.get(o) != v]
        assert not lost, f"{len(lost)} acknowledged records lost or changed, first at offset {lost[0]}"


def _verify(data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "services")}
    return subprocess.run(
        [sys.executable, "-m", "sluice", "broker", "verify", str(data_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def _produce_until_accepted(ledger: Ledger, broker: Broker, topic: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    code = ledger.produce(broker, topic)
    while code != common_pb2.NONE and time.monotonic() < deadline:
        time.sleep(0.2)  # the guard re-reads statvfs at most every 0.5 s while refusing
        code = ledger.produce(broker, topic)
    assert code == common_pb2.NONE, f"produce still refused after space was freed: {code}"


def test_disk_full_refuses_produce_typed_keeps_reads_and_recovers_in_process(tmpfs: Path) -> None:
    data_dir = tmpfs / "data"
    min_free = 8 * MiB
    _ballast(tmpfs / "ballast", 40 * MiB)
    broker = start_broker(data_dir, "--storage-min-free-bytes", str(min_free), flush="always")
    try:
        pid = broker.proc.process.pid
        broker.assign("full", segment_bytes=2 * MiB)  # several rolls (indexes, snapshots) on the way
        ledger = Ledger()
        code, message = ledger.fill(broker, "full")
        assert code == common_pb2.STORAGE_FULL, message
        assert "writes are refused until space is freed" in message
        # Refused before the disk is full: most of the reserve is still there for side files (indexes,
        # snapshots and page rounding take a little of it: appends alone are counted between statvfs).
        assert _free(tmpfs) >= min_free * 3 // 4
        assert len(ledger.acked) > 1000
        # Reads go on while writes are refused.
        ledger.read_back(broker, "full")
        free = broker.metric("sluice_broker_disk_free_bytes", log_dir=str(data_dir))
        assert free is not None
        assert free < min_free
        assert broker.metric("sluice_broker_disk_total_bytes", log_dir=str(data_dir)) == TMPFS_BYTES
        assert broker.metric("sluice_broker_disk_min_free_bytes", log_dir=str(data_dir)) == min_free
        refusals = broker.metric("sluice_broker_disk_full_refusals_total", log_dir=str(data_dir))
        assert refusals is not None
        assert refusals >= 1
        # Still refused while nothing changes.
        assert ledger.produce(broker, "full") == common_pb2.STORAGE_FULL
        (tmpfs / "ballast").unlink()  # an operator frees space
        _produce_until_accepted(ledger, broker, "full")
        for _ in range(20):
            assert ledger.produce(broker, "full") == common_pb2.NONE
        assert broker.proc.process.pid == pid
        assert broker.alive()
        ledger.read_back(broker, "full")
        assert "Traceback" not in broker.proc.log()
    finally:
        assert broker.stop() == 0
    verify = _verify(data_dir)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "0 damaged" in verify.stdout


def test_real_enospc_is_cut_back_and_the_broker_goes_on(tmpfs: Path) -> None:
    """No guard (minimum 0): appends meet the real ENOSPC mid-write. Nothing torn is left behind."""
    data_dir = tmpfs / "data"
    _ballast(tmpfs / "ballast", 48 * MiB)
    broker = start_broker(data_dir, "--storage-min-free-bytes", "0", flush="always")
    try:
        broker.assign("enospc", segment_bytes=2 * MiB)
        ledger = Ledger()
        code, message = ledger.fill(broker, "enospc")
        assert code == common_pb2.STORAGE_FULL, message
        assert "No space left on device" in message
        assert _free(tmpfs) < RECORDS_PER_BATCH * (VALUE_BYTES + 64)  # it really was full
        ledger.read_back(broker, "enospc")
        # Retries on the full disk are refused the same way, and leave no bytes behind either.
        for _ in range(5):
            assert ledger.produce(broker, "enospc") == common_pb2.STORAGE_FULL
        (tmpfs / "ballast").unlink()
        _produce_until_accepted(ledger, broker, "enospc")
        ledger.read_back(broker, "enospc")
        assert broker.alive()
        assert "Traceback" not in broker.proc.log()
    finally:
        with contextlib.suppress(grpc.RpcError):
            assert broker.stop() == 0
    verify = _verify(data_dir)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_the_sdk_producer_retries_storage_full_until_space_returns(tmpfs: Path) -> None:
    """STORAGE_FULL is retriable: sends made while the disk is full complete once it is freed, each at
    the offset its future reports (a coordinator for metadata, one broker on the tmpfs)."""
    data_dir = tmpfs / "data"
    with run_redis(appendonly=False) as redis:
        coordinator = start_service(
            "coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url,
            "--broker-heartbeat-interval", "200ms",
        )  # fmt: skip
        broker = start_broker(
            data_dir,
            "--storage-min-free-bytes",
            str(8 * MiB),
            "--coordinator",
            coordinator.address,
            flush="always",
        )
        try:
            with Client(coordinator.address) as client:
                client.admin.create_topic("sdk", partitions=1)
                _ballast(tmpfs / "ballast", _free(tmpfs) - 4 * MiB)  # below the minimum from the start
                # A scrape re-reads statvfs (else the guard sees the ballast within its 5 s refresh).
                free = broker.metric("sluice_broker_disk_free_bytes", log_dir=str(data_dir))
                assert free is not None
                assert free < 8 * MiB
                with client.producer(
                    "sdk", retries=1000, retry_backoff_max="500ms", linger="1ms"
                ) as producer:
                    values = [f"sdk-{i}".encode() for i in range(50)]
                    futures = [producer.send(v) for v in values]
                    deadline = time.monotonic() + 30
                    while not broker.metric("sluice_broker_disk_full_refusals_total", log_dir=str(data_dir)):
                        assert time.monotonic() < deadline, "the broker never refused the producer"
                        time.sleep(0.1)
                    assert not any(f.done() for f in futures)  # retrying, not failed
                    (tmpfs / "ballast").unlink()
                    offsets = [f.result(timeout=60).offset for f in futures]
            got = {r.offset: r.value for r in records(broker.fetch_one("sdk", 0, max_bytes=MiB), 0)}
            assert [got[o] for o in offsets] == values
        finally:
            broker.stop()
            coordinator.terminate()
