"""How long loading a push subscription's parking store takes: the whole log against a snapshot.

A parking store (``<topic>.<sub>.PARK``, docs/poison-keys.md) that has seen ``--events`` events (a key
parked and resolved again and again, then a few records still parked) is loaded by a dispatcher three
times: the whole log (no snapshot yet; the load then writes one, as a load that read a long tail does),
from that snapshot, and the whole log again after a bad snapshot is appended. The dispatcher logs each
load's source and duration; printed here with the load average.

    PYTHONPATH=services:. python bench/poison_store_replay.py --events 200000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.push.conftest import run_push_cluster

from sluice import Client
from sluice.retry.parkbook import H_HOW, H_OP, H_PCOUNT, H_PDUE, H_PSOURCE

LOADED = re.compile(
    r"parked keys restored from \S+ \(snapshot at (-?\d+), then (\d+) events(.*)\) in ([\d.]+) s"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    args = ap.parse_args()
    with run_push_cluster() as cluster, Client(cluster.bootstrap, request_timeout=30) as client:
        topic = f"replay-{uuid.uuid4().hex[:6]}"
        client.admin.create_topic(topic, partitions=1)
        park = f"{topic}.s.PARK"
        client.admin.create_topic(park, partitions=1)
        n = args.events // 2
        with client.producer(park, linger="20ms") as producer:
            for i in range(n):  # parked, then resolved: replayed, then forgotten
                src = f"{topic}/0/{i}".encode()
                producer.send(
                    b"v" * 100,
                    key=b"k",
                    headers={H_OP: b"park", H_PSOURCE: src, H_PCOUNT: b"1", H_PDUE: b"0"},
                )
                producer.send(b"", key=b"k", headers={H_OP: b"resolved", H_PSOURCE: src, H_HOW: b"dlq"})
            for i in range(n, n + 5):  # still parked at the end
                src = f"{topic}/0/{i}".encode()
                producer.send(
                    b"v" * 100,
                    key=b"p",
                    headers={H_OP: b"park", H_PSOURCE: src, H_PCOUNT: b"1", H_PDUE: b"0"},
                )
            producer.flush()
        rows = []
        for label in (
            "whole log (no snapshot)",
            "from the snapshot the first load wrote",
            "whole log (bad snapshot)",
        ):
            if label.endswith("(bad snapshot)"):
                with client.producer(park + "SNAP", linger="1ms") as producer:
                    producer.send(
                        b"",
                        headers={H_OP: b"snapshot", "sluice-snap-count": b"0", "sluice-snap-covers": b"1"},
                    )
                    producer.flush()
            cluster.restart_dispatcher(kill=True)
            load = os.getloadavg()[0]
            t0 = time.monotonic()
            with client.push_consumer(
                topic, "s", "key_shared", initial_position="earliest", park_after=1
            ) as pc:
                del pc
            took = time.monotonic() - t0
            m = LOADED.findall(cluster.dispatcher.log())[-1]
            rows.append(
                {
                    "load": label,
                    "snapshot_covers": int(m[0]),
                    "events_read": int(m[1]),
                    "note": m[2],
                    "store_load_s": float(m[3]),
                    "subscribe_s": round(took, 2),
                    "load_average": round(load, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            time.sleep(2.0)  # the snapshot the load writes lands


if __name__ == "__main__":
    main()
