"""Pull consumers with per-key poison parking (docs/poison-keys.md, "Pull consumers"): the good keys' rate.

    python bench/poison_pull.py [--records 100000] [--rounds 3]

One broker, coordinator and offset store; 1,000 keys on 4 partitions, one poison key with 15 % of the
records. Modes, interleaved round by round (each on a fresh group), all one consumer in this process:

- ``plain``: the topic without the poison key, ``park_poison_keys`` off (before: no parking code runs);
- ``park-idle``: the same topic, ``park_poison_keys`` on, nothing ever fails (the hooks' cost);
- ``healthy``: the topic with the poison key, parking on, the poison key's records processed like others;
- ``failing``: the same, every poison record ``fail()``ed (``max_redeliver=2``, delay 100 ms).

The figure: good records / seconds from the first poll to the last good record, and the CPU seconds this
process (the SDK's threads) used meanwhile: steadier than the rate on a shared machine. ``failing`` also
checks that every poison record ends in ``DLQ.<group>`` in order, once.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "services"))
sys.path.insert(0, str(ROOT))

from tests.harness import run_redis  # noqa: E402
from tests.integration.retry.conftest import read_all, start_retry_cluster  # noqa: E402

from sluice import Client  # noqa: E402
from sluice.retry.levels import dlq_topic  # noqa: E402

POISON = b"poison"
KEYS = 1000
PARTITIONS = 4


def _fill(client: Client, topic: str, records: int, with_poison: bool) -> tuple[int, list[bytes]]:
    client.admin.create_topic(topic, partitions=PARTITIONS)
    good, poison = 0, []
    with client.producer(topic) as p:
        for i in range(records):
            if i % 20 < 3:  # 15 %
                if with_poison:
                    value = f"poison-{i}".encode()
                    p.send(value, key=POISON)
                    poison.append(value)
                continue
            p.send(b"x" * 100, key=f"k{i % KEYS}".encode())
            good += 1
        p.flush(60)
    return good, poison


def _run(
    client: Client, topic: str, group: str, mode: str, good: int, poison: list[bytes]
) -> tuple[float, float]:
    cfg: dict[str, object] = {"auto_offset_reset": "earliest", "fetch_max_wait": "100ms"}
    if mode != "plain":
        cfg.update(park_poison_keys=True, max_redeliver=2, park_retry_delay="100ms")
    consumer = client.consumer(group, [topic], **cfg)  # type: ignore[arg-type]
    seen = 0
    started = time.monotonic()
    cpu0 = time.process_time()
    last, cpu = started, 0.0
    deadline = started + 600
    try:
        while seen < good or (mode == "failing" and len(read_all(client, dlq_topic(group))) < len(poison)):
            if time.monotonic() > deadline:
                raise SystemExit(f"{mode}: stuck at {seen}/{good}")
            for r in consumer.poll(0.2):
                if r.key == POISON:
                    if mode == "failing" and not consumer.is_parked(r):
                        consumer.fail(r)
                    continue
                seen += 1
                if seen == good:
                    last, cpu = time.monotonic(), time.process_time() - cpu0
        if mode == "failing":
            dead = [r.value for r in read_all(client, dlq_topic(group))]
            assert dead == poison, "poison records in the DLQ, in order, once"
    finally:
        consumer.close()
    return good / (last - started), cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--modes", default="plain,park-idle,healthy,failing", help="comma-separated, run in this order"
    )
    args = ap.parse_args()
    with run_redis(appendonly=False) as redis, tempfile.TemporaryDirectory(prefix="sluice-bench-") as d:
        cluster = start_retry_cluster(redis, Path(d))
        try:
            client = cluster.client()
            good, _ = _fill(client, "bench-good", args.records, with_poison=False)
            good2, poison = _fill(client, "bench-poison", args.records, with_poison=True)
            assert good == good2
            print(f"{good} good records, {len(poison)} poison records, {KEYS} keys, {PARTITIONS} partitions")
            topics = {"plain": "bench-good", "park-idle": "bench-good", "healthy": "bench-poison"}
            topics["failing"] = "bench-poison"
            modes = {m: topics[m] for m in args.modes.split(",")}
            rates: dict[str, list[float]] = {m: [] for m in modes}
            for rnd in range(args.rounds):
                for mode, topic in modes.items():
                    rate, cpu = _run(client, topic, f"bench-{mode}-{rnd}", mode, good, poison)
                    rates[mode].append(rate)
                    print(
                        f"round {rnd + 1} {mode:<10} {rate:>10,.0f} good records/s, this process's CPU "
                        f"{cpu:.2f} s",
                        flush=True,
                    )
            for mode, values in rates.items():
                print(
                    f"{mode:<10} best {max(values):>10,.0f}/s  median {statistics.median(values):>10,.0f}/s  "
                    f"rounds {' '.join(f'{v:,.0f}' for v in values)}"
                )
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
