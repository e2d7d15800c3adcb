"""Redrive N dead letters (default 100,000) with two kill -9s, and check each arrived exactly once.

    python bench/dlq_redrive.py [--records 100000]

1. fill ``DLQ.<group>`` with N records (as 17 failures leave them);
2. ``sluice dlq redrive --group G`` killed by itself between the acknowledgement of the batch that
   reaches N/2 and its cursor save (``SLUICE_REDRIVE_CRASH_AFTER``);
3. a second run killed from outside once it read N/4 more;
4. a third run to the end; then the retry topic is read back: every DLQ record's source exactly once,
   the original topic untouched (other groups saw nothing). Prints the time and rate of each run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "services"))
sys.path.insert(0, str(ROOT))

from tests.harness import run_redis  # noqa: E402
from tests.integration.retry.conftest import read_all, start_retry_cluster  # noqa: E402

from _redrive_runs import crash_and_resume  # noqa: E402
from sluice import Client  # noqa: E402
from sluice.retry.levels import H_COUNT, H_DLQ_SOURCE, H_OFFSET, H_PARTITION, H_TOPIC, dlq_topic, retry_topic  # noqa: E402

GROUP = "bench-redrive"


ARGS = ("--group", GROUP)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=100_000)
    n = parser.parse_args().records
    with run_redis(appendonly=True) as redis, tempfile.TemporaryDirectory(prefix="bench-redrive-") as d:
        cluster = start_retry_cluster(redis, Path(d))
        try:
            client = Client(cluster.bootstrap, request_timeout=30)
            cluster.clients.append(client)
            client.admin.create_topic("orders", partitions=1)
            client.consumer(GROUP, ["orders"], retry=True, retry_delay_levels="1s 2s 3s").close()
            t0 = time.monotonic()
            with client.producer(dlq_topic(GROUP)) as p:
                for i in range(n):
                    h = {H_TOPIC: b"orders", H_PARTITION: b"0", H_OFFSET: str(i).encode(), H_COUNT: b"17"}
                    p.send(b"x" * 100, headers=h, partition=0)
                p.flush()
            print(f"filled {n} dead letters in {time.monotonic() - t0:.1f}s")

            crash_and_resume(cluster.bootstrap, ARGS, n)

            written = read_all(client, retry_topic(GROUP), partitions=3, timeout=120)
            counts = Counter(r.headers[H_DLQ_SOURCE] for r in written)
            dups = sum(1 for c in counts.values() if c > 1)
            missing = n - len(counts)
            original_end = client.list_offsets("orders", "latest")
            print(
                f"at the target: {len(written)} records, {len(counts)} distinct sources, "
                f"{dups} duplicated, {missing} missing; original topic end {original_end}"
            )
            if dups or missing or len(written) != n:
                raise SystemExit("FAILED: not exactly once")
            print("OK: every record exactly once")
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
