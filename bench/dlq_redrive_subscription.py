"""Redrive N dead letters of a push subscription (default 100,000) with two kill -9s, and count each
arriving exactly once at the subscription, and none at another subscription of the topic.

    python bench/dlq_redrive_subscription.py [--records 100000]

1. fill ``orders.s.DLQ`` with N records (as the dispatcher leaves them, with their origin headers);
2. ``sluice dlq redrive --subscription s --topic orders`` killed by itself between the acknowledgement
   of the batch that reaches N/2 and its cursor save (``SLUICE_REDRIVE_CRASH_AFTER``);
3. a second run killed from outside once it read N/4 more;
4. a third run to the end; then a push consumer of subscription ``s`` on ``orders.s.REDRIVE`` receives
   (and acks) everything: every DLQ record exactly once; subscription ``other`` of ``orders`` got none.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "services"))
sys.path.insert(0, str(ROOT))

from tests.integration.push.conftest import run_push_cluster  # noqa: E402

from _redrive_runs import crash_and_resume  # noqa: E402
from sluice import Client  # noqa: E402
from sluice.retry.levels import H_DLQ_SOURCE, H_OFFSET, H_PARTITION, H_TOPIC, redrive_topic, sub_dlq_topic  # noqa: E402

TOPIC, SUB = "orders", "s"
ARGS = ("--subscription", SUB, "--topic", TOPIC)


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--records", type=int, default=100_000)
    n = parser.parse_args().records
    with run_push_cluster() as cluster, Client(cluster.bootstrap, request_timeout=30) as client:
        client.admin.create_topic(TOPIC, partitions=1)
        client.admin.create_topic(sub_dlq_topic(TOPIC, SUB), partitions=1)
        other = client.push_consumer(TOPIC, "other", "shared", initial_position="earliest")
        t0 = time.monotonic()
        with client.producer(sub_dlq_topic(TOPIC, SUB)) as p:
            for i in range(n):
                h = {H_TOPIC: TOPIC.encode(), H_PARTITION: b"0", H_OFFSET: str(i).encode()}
                p.send(b"x" * 100, headers=h, partition=0)
            p.flush()
        print(f"filled {n} dead letters in {time.monotonic() - t0:.1f}s")

        crash_and_resume(cluster.bootstrap, ARGS, n)

        t0 = time.monotonic()
        counts: Counter[bytes] = Counter()
        target = redrive_topic(TOPIC, SUB)
        with client.push_consumer(target, SUB, "shared", initial_position="earliest") as pc:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                try:
                    msg = pc.receive(timeout=2.0)  # 2 s quiet: the redrive topic is drained
                except TimeoutError:
                    break
                counts[msg.headers[H_DLQ_SOURCE]] += 1
                pc.ack(msg)
        took = time.monotonic() - t0
        try:
            stray = [other.receive(timeout=1.0)]
        except TimeoutError:
            stray = []
        other.close()
        dups = sum(1 for c in counts.values() if c > 1)
        missing = n - len(counts)
        print(
            f"at subscription {SUB}: {sum(counts.values())} messages in {took:.1f}s, {len(counts)} distinct "
            f"sources, {dups} duplicated, {missing} missing; subscription other got {len(stray)}; "
            f"topic {TOPIC} end {client.list_offsets(TOPIC, 'latest')}"
        )
        if dups or missing or stray:
            raise SystemExit("FAILED: not exactly once at the subscription alone")
        print("OK: every record exactly once at the subscription, none elsewhere")


if __name__ == "__main__":
    main()
