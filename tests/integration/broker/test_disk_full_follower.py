"""A follower whose disk fills leaves the in-sync set instead of stalling its leader (issue 16).

Three brokers, each on its own 64 MiB tmpfs, factor 3, min ISR 2, lag time 2 s. One follower's disk is
filled (a ballast file) below its minimum of free bytes: its appends are refused with STORAGE_FULL, it
parks the partition instead of fetching the same bytes in a loop, the leader drops it from the ISR by
lag time, and acks=all goes on with the leader and the other follower. Freed, it catches up by itself
(same process) and rejoins the ISR, byte for byte. Skipped where tmpfs cannot be mounted.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.v1 import common_pb2

from .conftest import make_batch, vals
from .test_replication import BROKERS, cluster_of, create, isr, until

MiB = 1024 * 1024
MIN_FREE = 8 * MiB


@pytest.fixture
def broker_disks(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path/b<id>`` (each broker's data directory in ``cluster_of``) as a 64 MiB tmpfs each."""
    mounted: list[Path] = []
    try:
        for broker_id in range(BROKERS):
            mnt = tmp_path / f"b{broker_id}"
            mnt.mkdir()
            run = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={64 * MiB}", "tmpfs", str(mnt)],
                capture_output=True,
                timeout=30,
                check=False,
            )
            if run.returncode != 0:
                pytest.skip(
                    f"a size-limited tmpfs is needed (root or CAP_SYS_ADMIN): {run.stderr.decode().strip()}"
                )
            mounted.append(mnt)
        yield tmp_path
    finally:
        for mnt in mounted:
            if subprocess.run(["umount", str(mnt)], capture_output=True, check=False).returncode != 0:
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def _fill_to(directory: Path, leave: int) -> Path:
    """Write a ballast file leaving about ``leave`` bytes free."""
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    ballast = directory / "ballast"
    with open(ballast, "wb") as f:
        remaining = max(free - leave, 0)
        chunk = b"\xab" * MiB
        while remaining > 0:
            remaining -= f.write(chunk[: min(MiB, remaining)])
    return ballast


def test_a_follower_with_a_full_disk_leaves_the_isr_and_rejoins_once_freed(
    broker_disks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_BROKER_STORAGE_MIN_FREE_BYTES", str(MIN_FREE))  # the brokers' environment
    with cluster_of(broker_disks, lag="2s", session="60s") as cluster:
        create(cluster, "fill")
        state = cluster.partition("fill")
        leader = cluster.brokers[state.broker_id]
        full, healthy = (i for i in sorted(cluster.brokers) if i != state.broker_id)
        until(lambda: isr(cluster, "fill") == [0, 1, 2], "the ISR to form")
        assert leader.produce("fill", 0, make_batch(vals(10, "a")), acks=-1).error.code == common_pb2.NONE
        ballast = _fill_to(broker_disks / f"b{full}", leave=MIN_FREE // 2)
        pid = cluster.brokers[full].proc.process.pid

        # Produce on: the follower's guard sees the ballast at its next statvfs (within 5 s), refuses
        # appends and stops fetching; acks=all waits for it at most until the leader drops it from the ISR
        # by lag time (2 s), then is answered by the leader and the healthy follower (min ISR 2 holds).
        acked, slowest = 10, 0.0
        deadline = time.monotonic() + 40
        while isr(cluster, "fill") != sorted((state.broker_id, healthy)):
            assert time.monotonic() < deadline, "the full follower never left the ISR"
            started = time.monotonic()
            answer = leader.produce("fill", 0, make_batch(vals(10, f"b{acked}-")), acks=-1)
            assert answer.error.code == common_pb2.NONE, answer.error.message
            slowest = max(slowest, time.monotonic() - started)
            acked += 10
            time.sleep(0.05)
        assert slowest < 15, f"an acks=all produce waited {slowest:.1f}s for the full follower"
        # Once out of the ISR, acks=all is prompt again.
        quick = time.monotonic()
        assert leader.produce("fill", 0, make_batch(vals(10, "c")), acks=-1).error.code == common_pb2.NONE
        acked += 10
        assert time.monotonic() - quick < 2.0
        follower = cluster.brokers[full]
        assert follower.alive()
        refusals = follower.metric("sluice_broker_disk_full_refusals_total", log_dir=str(follower.data_dir))
        assert refusals is not None
        assert refusals >= 1

        ballast.unlink()  # space returns: the follower catches up and rejoins, same process
        until(lambda: isr(cluster, "fill") == [0, 1, 2], "the follower to rejoin the ISR", timeout=30)
        assert cluster.brokers[full].proc.process.pid == pid
        until(
            lambda: cluster.segments(full, "fill") == cluster.segments(state.broker_id, "fill"),
            "the follower to match the leader byte for byte",
        )
        assert leader.offsets("fill", -1).offset == acked
        assert "Traceback" not in follower.proc.log()
