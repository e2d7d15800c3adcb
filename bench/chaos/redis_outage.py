"""Issue 16, "Redis down or slow", the full run: Redis stopped for 30 s (``kill -9``, restarted on its port
with its data), then paused for 30 s (``CLIENT PAUSE 30000 ALL``), under group consumption (a consumer
committing after every poll, a producer at ~400 records/s) and a push subscription on a dispatcher. The
same checks as the suite's short run (``tests/chaos/test_redis_outage.py``, 12 s outages): no service
exits, no acknowledged commit lost, consumption resumes by itself, no traceback, bounded warnings, a commit
sent into the pause reported in doubt. Prints the counts; exits 1 on a failed check.

    python bench/chaos/redis_outage.py --outage 30 --commit-timeout 30s
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(BENCH), str(BENCH.parent), str(BENCH.parent / "services")]

from tests.chaos.redis_outage import outage_stack, run  # noqa: E402

from _stack import save  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description="Redis stopped, then paused, under group consumption")
    parser.add_argument("--outage", type=float, default=30.0, help="seconds of each outage")
    parser.add_argument(
        "--commit-timeout", default="30s", help="the consumer's request_timeout (the SDK default: 30s)"
    )
    args = parser.parse_args()
    with outage_stack() as (cluster, dispatcher):
        try:
            summary = run(cluster, dispatcher, args.outage, args.commit_timeout)
        except AssertionError:
            traceback.print_exc()
            sys.exit(1)
    save("redis_outage", {"outage_s": args.outage, "commit_timeout": args.commit_timeout, "summary": summary})


if __name__ == "__main__":
    main()
