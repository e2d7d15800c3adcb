"""The nightly fuzz campaign: tests/integration/fuzz with many more examples per RPC.

The same cluster (coordinator, broker, offset store, dispatcher over a private Redis, no authentication),
the same requests (arbitrary well-typed messages from the descriptors, raw bytes, short streams) and the
same verdict per call (OK or a typed Sluice error; INTERNAL, UNKNOWN, a status without a registered
``sluice-error-code`` or a unary call with no answer is a failure). Failures do not stop the campaign:
each is counted with its first input. After each RPC every process must answer its health check SERVING
with no traceback in its log. Prints the count of each outcome per RPC and exits 1 on any failure.

Usage: ``python bench/fuzz/rpcs.py [--examples 1000] [--rpc SUBSTRING]``
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "services"))
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from tests.integration.fuzz.conftest import assert_healthy, processes, seed  # noqa: E402
from tests.integration.fuzz.rpcs import ORDERED, RPCS, Failure, call, request_strategy  # noqa: E402
from tests.integration.push.conftest import run_push_cluster  # noqa: E402


def fuzz_one(address: str, path: str, examples: int) -> tuple[collections.Counter[str], list[str]]:
    rpc = RPCS[path]
    outcomes: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    with grpc.insecure_channel(address) as channel:

        @settings(
            max_examples=examples,
            deadline=None,
            phases=[Phase.generate],  # count, do not shrink: the test suite shrinks what this finds
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        @given(request=request_strategy(rpc))
        def fuzz(request: Any) -> None:
            try:
                outcomes[call(channel, rpc, request)] += 1
            except Failure as failure:
                outcomes["FAILURE"] += 1
                if len(failures) < 3:
                    failures.append(f"{failure} <- {str(request)[:300]!r}")

        fuzz()
    return outcomes, failures


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--examples", type=int, default=1000, help="examples per RPC")
    parser.add_argument("--rpc", default="", help="only RPCs whose path contains this")
    args = parser.parse_args()
    failed = False
    with run_push_cluster() as cluster:
        seed(cluster)
        addresses = {name: sp.address for name, sp in processes(cluster).items()}
        for path in [p for p in ORDERED if args.rpc in p]:
            started = time.monotonic()
            outcomes, failures = fuzz_one(addresses[RPCS[path].process], path, args.examples)
            try:
                assert_healthy(cluster)
            except AssertionError as exc:
                failures.append(f"after {path}: {str(exc)[:2000]}")
                outcomes["UNHEALTHY"] += 1
            counts = ", ".join(f"{k} {v}" for k, v in outcomes.most_common())
            print(f"{path}  ({time.monotonic() - started:.1f} s)  {counts}", flush=True)
            for line in failures:
                print(f"    FAILURE {line}", flush=True)
            failed = failed or bool(failures)
            if outcomes["UNHEALTHY"]:
                break  # the cluster is broken: what follows would only repeat it
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
