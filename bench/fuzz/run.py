"""The long fuzz campaign: every property of the suite's fuzz tests, with many more examples.

Two parts, each a separate process so one crash cannot hide the other's figures:

1. **Offline properties** (``tests/unit/fuzz``): the batch codec under structured-but-wrong batches,
   the tag filter parser, the command line and every service's flags. Run by pytest with the
   Hypothesis profile ``fuzz`` (``tests/conftest.py``), ``--examples`` per property.
2. **Every RPC of every service** against a real cluster (``bench/fuzz/rpcs.py``, the suite's
   ``tests/integration/fuzz`` with ``--rpc-examples`` per RPC).

Prints the case count of each part and exits non-zero if either found a failure.

Usage: ``python bench/fuzz/run.py [--examples 20000] [--rpc-examples 1000] [--skip-rpcs]``
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _offline(examples: int) -> tuple[int, int]:
    """Run the offline properties; returns (exit code, cases run)."""
    env = os.environ | {
        "SLUICE_HYPOTHESIS_PROFILE": "fuzz",
        "SLUICE_FUZZ_EXAMPLES": str(examples),
        "PYTHONPATH": str(ROOT / "services"),
    }
    tests = ["tests/unit/fuzz"]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=0", *tests]
    command += ["--hypothesis-show-statistics"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    print(done.stdout[-4000:])
    # The statistics fill the tail: print every failure's own lines too (its exception and input).
    failures = [line for line in done.stdout.splitlines() if line.startswith(("E ", "FAILED"))]
    if failures:
        print("\n".join(failures[:200]))
    # Hypothesis's statistics: "- 200 passing, 0 failing, and 42 invalid test cases" per phase.
    cases = sum(int(n) for n in re.findall(r"(\d+) passing, \d+ failing", done.stdout))
    return done.returncode, cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=20_000, help="examples per offline property")
    parser.add_argument("--rpc-examples", type=int, default=1_000, help="examples per RPC")
    parser.add_argument("--skip-rpcs", action="store_true", help="run only the offline properties")
    args = parser.parse_args()
    started = time.monotonic()
    offline_rc, cases = _offline(args.examples)
    print(f"offline properties: exit {offline_rc}, {cases} passing cases, {time.monotonic() - started:.0f} s")
    rpc_rc = 0
    if not args.skip_rpcs:
        command = [sys.executable, str(ROOT / "bench/fuzz/rpcs.py"), "--examples", str(args.rpc_examples)]
        rpc_rc = subprocess.run(command, cwd=ROOT, check=False).returncode
        print(f"RPC campaign: exit {rpc_rc}")
    print(f"total {time.monotonic() - started:.0f} s")
    return 1 if offline_rc or rpc_rc else 0


if __name__ == "__main__":
    raise SystemExit(main())
