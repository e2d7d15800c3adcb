"""The three runs both redrive benches make (groups: dlq_redrive.py, subscriptions:
dlq_redrive_subscription.py): one that kills itself between a batch's acknowledgement and its cursor save,
one killed from outside part way, and one to the end. What each then checks at its target is its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from sluice.cli.dlq_redrive import CRASH_ENV

ROOT = Path(__file__).resolve().parent.parent


def redrive(
    bootstrap: str, args: tuple[str, ...], env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``sluice dlq redrive ARGS`` as a process of its own (so a kill -9 is a real one)."""
    return subprocess.Popen(
        [sys.executable, "-m", "sluice", "--bootstrap", bootstrap, "dlq", "redrive", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT / "services"), **(env or {})},
        cwd=ROOT,
    )


def crash_and_resume(bootstrap: str, args: tuple[str, ...], n: int) -> None:
    """Run 1 dies after the acknowledgement that reaches n/2, before its cursor save; run 2 is killed
    from outside once it has read n/4 more; run 3 goes to the end. Prints each run's time and progress."""
    t0 = time.monotonic()
    proc = redrive(bootstrap, args, env={CRASH_ENV: str(n // 2)})
    proc.communicate(timeout=3600)
    print(
        f"run 1: killed itself after the ack at {n // 2}, before the cursor save "
        f"(rc {proc.returncode}) after {time.monotonic() - t0:.1f}s"
    )

    t0 = time.monotonic()
    proc = redrive(bootstrap, args)
    assert proc.stderr is not None
    line = ""
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        line = proc.stderr.readline().decode()
        m = re.search(r"read (\d+)/", line)
        if (m and int(m.group(1)) >= n // 4) or not line:
            break
    proc.kill()
    _, rest = proc.communicate(timeout=60)
    last = (line + rest.decode()).strip().splitlines()
    print(f"run 2: killed from outside after {time.monotonic() - t0:.1f}s; last: {last[-1] if last else ''}")

    t0 = time.monotonic()
    proc = redrive(bootstrap, args)
    out, err = proc.communicate(timeout=3600)
    lines = err.decode().strip().splitlines()
    print(
        f"run 3: {out.decode().strip()} in {time.monotonic() - t0:.1f}s; last: {lines[-1] if lines else ''}"
    )
