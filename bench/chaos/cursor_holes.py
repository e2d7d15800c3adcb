"""The dispatcher's cursor with holes across a kill -9, at the issue's size: every other message of
``--messages`` (default 1,000,000) acknowledged on a Shared subscription, the dispatcher killed with
``kill -9`` and restarted; exactly the unacknowledged half must come back, in order, each counted as
redelivered once, and nothing acknowledged. The suite runs the same scenario with 20,000
(``tests/integration/dispatcher/test_redelivery.py``). Prints the time taken; exits 1 on a failed check.

    python bench/chaos/cursor_holes.py [--messages 1000000]
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(BENCH), str(BENCH.parent), str(BENCH.parent / "services")]

from tests.integration.dispatcher.conftest import run_cluster  # noqa: E402
from tests.integration.dispatcher.test_redelivery import cursor_with_holes_survives_kill_9  # noqa: E402

from _stack import save  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description="acked holes of a Shared subscription across kill -9")
    parser.add_argument(
        "--messages", type=int, default=1_000_000, help="a multiple of 5,000 (produced in 5,000s)"
    )
    args = parser.parse_args()
    # As the suite's module: cursors flushed every 50 ms, no memory budget (the whole backlog in flight).
    with run_cluster("--cursor-flush-interval", "50ms", "--memory-budget-bytes", "0") as cluster:
        started = time.monotonic()
        try:
            cursor_with_holes_survives_kill_9(cluster, args.messages)
        except AssertionError:
            traceback.print_exc()
            sys.exit(1)
        seconds = time.monotonic() - started
    print(
        f"{args.messages:,} messages, every other one acked, kill -9: "
        f"exactly the other half back in {seconds:.1f} s"
    )
    save("cursor_holes", {"messages": args.messages, "seconds": round(seconds, 1)})


if __name__ == "__main__":
    main()
