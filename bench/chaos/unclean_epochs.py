"""The long version of tests/integration/dispatcher/test_leader_epochs.py (KIP-320 for push subscriptions):
``--rounds`` fresh clusters (three brokers, factor 3, min ISR 1, unclean election on), each with
``--kept`` records on every replica and ``--lost`` more on the leader alone, read by a push subscription of
each type that acknowledges the first half of the lost ones and holds the rest in flight. The leader dies,
a follower without the lost records is elected and takes writes. Checked per round and type: the first
records after the election are the new leader's, from where the logs diverge; nothing of the old log comes
back; one truncation counted. Reported: the time from the new leader's first write to its first record
delivered (the feed's check included).

    python bench/chaos/unclean_epochs.py --rounds 5 --lost 2000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "services"))
sys.path.insert(0, str(ROOT))

from tests.integration.client.test_consumers_failover import failover_cluster  # noqa: E402
from tests.integration.dispatcher.test_leader_epochs import (  # noqa: E402
    lone_leader_writes,
    metric,
    unclean_election,
)

from sluice import Client  # noqa: E402
from sluice.client.push import Message  # noqa: E402

TYPES = ("shared", "key_shared", "exclusive")


def one_round(kept: int, lost: int) -> dict[str, float]:
    """Seconds from the new leader's write to its first record at each subscription."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        failover_cluster(Path(tmp)) as (cluster, others),
        Client(cluster.coordinator.address) as client,
    ):
        leader = lone_leader_writes(cluster, client, kept, lost)
        consumers = {t: client.push_consumer("unc", f"s-{t}", t, initial_position="earliest") for t in TYPES}
        for t, c in consumers.items():
            got: list[Message] = []
            deadline = time.monotonic() + 60
            while len(got) < kept + lost and time.monotonic() < deadline:
                got += c.receive_many(kept + lost - len(got), timeout=0.5)
            assert sorted(m.offset for m in got) == list(range(kept + lost)), t
            for m in got:
                if m.offset < kept + lost // 2:
                    c.ack(m)
        unclean_election(cluster, leader)
        written = time.monotonic()
        out: dict[str, float] = {}
        firsts: dict[str, list[Message]] = {t: [] for t in TYPES}
        deadline = written + 60
        while len(out) < len(TYPES) and time.monotonic() < deadline:  # every type at once: fair timings
            for t, c in consumers.items():
                if t not in out:
                    firsts[t] += c.receive_many(2 - len(firsts[t]), timeout=0.02)
                    if firsts[t]:
                        out.setdefault(t, time.monotonic() - written)
        for t, c in consumers.items():
            got = firsts[t]
            while len(got) < 2 and time.monotonic() < deadline:
                got += c.receive_many(2 - len(got), timeout=0.2)
            values = [(m.offset, m.value) for m in got + c.receive_many(10, timeout=1.0)]
            assert values == [(kept, b"n0"), (kept + 1, b"n1")], (t, values[:5])
            found = metric(others[1], "sluice_dispatcher_log_truncations_total", subscription=f"s-{t}")
            assert found == 1, (t, found)
            c.close()
        return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kept", type=int, default=200)
    parser.add_argument("--lost", type=int, default=1000)
    args = parser.parse_args()
    times: dict[str, list[float]] = {t: [] for t in TYPES}
    for r in range(args.rounds):
        for t, s in one_round(args.kept, args.lost).items():
            times[t].append(s)
        print(f"round {r + 1}/{args.rounds}: ok", flush=True)
    for t, xs in times.items():
        print(
            f"{t}: first new record {statistics.median(xs):.2f} s median, {max(xs):.2f} s max after the write"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
