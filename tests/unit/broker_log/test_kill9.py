"""A real kill -9 of a process appending and flushing: every acknowledged batch survives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from sluice.broker.log import LogConfig, PartitionLog
from sluice.codec.batch import encode_records

from .helpers import read_all

SERVICES = Path(__file__).resolve().parents[3] / "services"

# The child appends batches of 7 records forever, flushing each (flush=always) and only
# then acknowledging the batch's last offset on stdout.
CHILD = """
import sys
from pathlib import Path
from sluice.broker.log import LogConfig, PartitionLog
from sluice.codec.batch import encode_records

log = PartitionLog(Path(sys.argv[1]), LogConfig(segment_bytes=20_000, index_interval_bytes=500))
i = 0
while True:
    batch = encode_records([(b"v%d-%d" % (i, j) * 5, None, None, None, i) for j in range(7)])
    result = log.append(batch)
    log.flush()
    sys.stdout.write(f"{result.last_offset}\\n")
    sys.stdout.flush()
    i += 1
"""


def test_acknowledged_appends_survive_kill_9(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SERVICES)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None
    acked = -1
    try:
        while acked < 700:  # enough to roll a few segments
            line = child.stdout.readline()
            assert line, "child died"
            acked = int(line)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=20_000, index_interval_bytes=500))
    assert log.log_end_offset > acked
    assert len(log.segment_base_offsets()) > 2
    records = read_all(log)
    assert [r.offset for r in records] == list(range(log.log_end_offset))
    assert records[acked].value.startswith(f"v{acked // 7}-6".encode())
    end = log.log_end_offset
    assert log.append(encode_records([(b"after", None, None, None, 0)])).base_offset == end
