"""The suite's heaviest property tests at many times their examples (``tests/examples.py``).

The suite runs each of these properties with the count its ``examples(n)`` names, sized for the suite's
time budget (docs/testing.md, "Test-suite budget"); this runs the same tests with
``SLUICE_EXAMPLES_FACTOR=--factor`` (default 10: more examples than each had before the budget), so a
bug the short runs are unlikely to hit still gets a long run. Prints pytest's summary and the slowest
tests; exits with pytest's code.

    python bench/properties.py [--factor 10]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Every test module that sizes a property with ``tests.examples.examples``.
MODULES = sorted(
    str(p.relative_to(ROOT))
    for p in (ROOT / "tests").rglob("test_*.py")
    if "from tests.examples import examples" in p.read_text()
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--factor", type=int, default=10, help="examples per property, times the suite's")
    args = parser.parse_args()
    env = os.environ | {"SLUICE_EXAMPLES_FACTOR": str(args.factor), "PYTHONPATH": str(ROOT / "services")}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=0"]
    command += ["--durations=10", *MODULES]
    print(f"factor {args.factor}: {len(MODULES)} modules", flush=True)
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
