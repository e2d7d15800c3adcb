"""Batch compression: size ratio and throughput of each codec on realistic JSON records (docs/compression.md).

    PYTHONPATH=services:. python bench/compression.py --records 100000 --rounds 3

The records are order events as a shop's services emit them: JSON objects of 250-700 bytes with
varied fields (ids, a status from a few, 1-5 line items with SKUs, prices and quantities, a shipping
address, a currency and a country), a 16-byte key, two headers (``region`` of 10, ``status``) and the
event type as the tag. Two parts, for ``none``, ``lz4``, ``zstd`` and ``gzip``:

- ``codec`` (in this process, no services, medians over ``--rounds``): batches of 1 MiB of records as
  the producer builds them; the stored bytes over the plain bytes; the producer's encode rate; the
  broker's produce validation per batch (the compressed batch is inflated and checked); the consumer's
  decode rate; and the broker's SQL filtering (``region = 'r3'``: 10 % of the records, in every batch,
  so each batch is inflated and filtered; ``region = 'zz'``: none, every batch pruned by its header
  summary, no inflation).
- ``e2e`` (a real coordinator and broker, ``_stack``): ``--records`` records produced through the SDK
  (one topic per codec, one partition), the stored log bytes, then read back with a ``Fetcher``:
  records/s and MB/s (of the JSON values) each way, and the broker's CPU seconds while producing.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from _stack import cpu_seconds, save, stack
from sluice.broker.filtering import filter_chunk
from sluice.codec.batch import BatchBuilder, decode_records, stamp, validate_batch
from sluice.codec.batch.compression import CODECS, is_available
from sluice.codec.sql_filter import compile_sql

STATUSES = ("created", "paid", "packed", "shipped", "delivered", "cancelled", "refunded")
COUNTRIES = ("DE", "FR", "NL", "US", "GB", "ES", "IT", "PL", "SE", "JP")
STREETS = ("Main St", "Station Rd", "Church Ln", "High St", "Park Ave", "Mill Rd", "King St")
Rec = tuple[bytes, bytes, str, dict[str, bytes], int]


def order_events(n: int, seed: int = 7) -> list[Rec]:
    """``n`` order events (value, key, tag, headers, timestamp_ms), deterministic for ``seed``."""
    rng = random.Random(seed)
    t0 = 1_780_000_000_000
    out: list[Rec] = []
    for i in range(n):
        status = rng.choice(STATUSES)
        items = [
            {
                "sku": f"SKU-{rng.randrange(100_000):06d}",
                "qty": rng.randint(1, 5),
                "unit_price": round(rng.uniform(1, 300), 2),
                "discount": rng.choice((0, 0, 0, 5, 10, 15)),
            }
            for _ in range(rng.randint(1, 5))
        ]
        event = {
            "event_id": f"{rng.getrandbits(64):016x}",
            "order_id": f"ORD-{1_000_000 + i}",
            "customer_id": f"C{rng.randrange(50_000):07d}",
            "status": status,
            "created_at": t0 + i * 3,
            "currency": rng.choice(("EUR", "USD", "GBP")),
            "items": items,
            "total": round(sum(it["qty"] * it["unit_price"] for it in items), 2),  # type: ignore[misc, operator]
            "shipping": {
                "street": f"{rng.randint(1, 300)} {rng.choice(STREETS)}",
                "city": f"City{rng.randrange(500)}",
                "zip": f"{rng.randrange(10_000, 99_999)}",
                "country": rng.choice(COUNTRIES),
            },
            "channel": rng.choice(("web", "ios", "android", "store")),
            "coupon": rng.choice((None, None, None, f"SAVE{rng.randrange(5, 50)}")),
        }
        value = json.dumps(event, separators=(",", ":")).encode()
        headers = {"region": f"r{rng.randrange(10)}".encode(), "status": status.encode()}
        key = f"ORD-{1_000_000 + i}".encode().ljust(16, b"_")
        out.append((value, key, f"order.{status}", headers, t0 + i * 3))
    return out


def batches(records: list[Rec], codec: int, batch_bytes: int = 1 << 20) -> tuple[list[bytes], float]:
    """The records as the producer batches them (``batch_bytes`` of records each), and the build time."""
    out: list[bytes] = []
    elapsed = 0.0
    b = BatchBuilder(codec)
    for value, key, tag, headers, ts in records:
        b.append(value, key, tag, headers, ts)
        if b.size >= batch_bytes:
            t = time.perf_counter()
            out.append(b.build())
            elapsed += time.perf_counter() - t
            b = BatchBuilder(codec)
    if len(b):
        t = time.perf_counter()
        out.append(b.build())
        elapsed += time.perf_counter() - t
    return out, elapsed


def stamped_log(built: list[bytes]) -> bytes:
    """The batches as the broker's log holds them (offsets stamped), concatenated."""
    log = bytearray()
    offset = 0
    for raw in built:
        pos = len(log)
        log += raw
        stamp(log, pos, offset, 1, 0)
        offset += int.from_bytes(raw[44:48], "little")
    return bytes(log)


def codec_part(records: list[Rec], rounds: int) -> dict[str, Any]:
    plain_bytes = sum(len(v) + len(k) for v, k, *_ in records)
    selective = compile_sql("region = 'r3'")
    nothing = compile_sql("region = 'zz'")
    n = len(records)
    out: dict[str, Any] = {}
    for name, codec in CODECS.items():
        if not is_available(codec):
            continue
        runs: list[dict[str, float]] = []
        for _ in range(rounds):
            built, build_s = batches(records, codec)
            stored = sum(map(len, built))
            t = time.perf_counter()
            for raw in built:
                validate_batch(raw, 0, 64 << 20, require_dense=True)
            validate_s = time.perf_counter() - t
            log = stamped_log(built)
            t = time.perf_counter()
            got = len(decode_records(log, "t", 0))
            decode_s = time.perf_counter() - t
            assert got == n
            t = time.perf_counter()
            kept = filter_chunk(log, 0, frozenset(), 1 << 40, True, selective)
            selective_s = time.perf_counter() - t
            t = time.perf_counter()
            none_kept = filter_chunk(log, 0, frozenset(), 1 << 40, True, nothing)
            nothing_s = time.perf_counter() - t
            assert not none_kept.batches
            assert kept.next_offset == n
            runs.append(
                {
                    "stored_bytes": stored,
                    "encode_records_per_s": n / build_s,
                    "encode_mb_per_s": plain_bytes / build_s / 1e6,
                    "validate_ms_per_batch": 1000 * validate_s / len(built),
                    "decode_records_per_s": n / decode_s,
                    "sql_filter_10pct_records_per_s": n / selective_s,
                    "sql_filter_pruned_records_per_s": n / nothing_s,
                }
            )
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        # Stored bytes of the uncompressed batches over this codec's: CODECS lists "none" first.
        med["ratio"] = out["none"]["stored_bytes"] / med["stored_bytes"] if out else 1.0
        med["batches"] = len(built)
        out[name] = {k: round(v, 3) if isinstance(v, float) else v for k, v in med.items()}
    return out


def e2e_part(records: list[Rec], bootstrap: str, broker_pid: int, data_dir: Path) -> dict[str, Any]:
    from sluice import Client

    n = len(records)
    value_mb = sum(len(r[0]) for r in records) / 1e6
    out: dict[str, Any] = {}
    with Client(bootstrap) as client:
        for name, codec in CODECS.items():
            if not is_available(codec):
                continue
            topic = f"compression-{name}"
            client.admin.create_topic(topic, partitions=1)
            cpu0 = cpu_seconds(broker_pid)
            t = time.perf_counter()
            with client.producer(topic, compression=name) as producer:
                send = producer.send
                for value, key, tag, headers, ts in records:
                    send(value, key=key, tag=tag, headers=headers, timestamp=ts)
                producer.flush()
            produce_s = time.perf_counter() - t
            broker_cpu = cpu_seconds(broker_pid) - cpu0
            stored = sum(p.stat().st_size for p in data_dir.rglob("*.log") if topic in str(p))
            fetcher = client.fetcher({(topic, 0): 0}, max_wait_ms=100)
            got = 0
            t = time.perf_counter()
            deadline = t + 300
            while fetcher.positions()[(topic, 0)] < n and time.perf_counter() < deadline:
                got += len(fetcher.fetch(0.05))
            consume_s = time.perf_counter() - t
            fetcher.close()
            assert got == n, (name, got)
            out[name] = {
                "produce_records_per_s": round(n / produce_s),
                "produce_value_mb_per_s": round(value_mb / produce_s, 2),
                "broker_cpu_s_producing": round(broker_cpu, 2),
                "stored_log_bytes": stored,
                "consume_records_per_s": round(n / consume_s),
                "consume_value_mb_per_s": round(value_mb / consume_s, 2),
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--name", default="compression", help="results file: bench/results/NAME.json")
    args = ap.parse_args()
    records = order_events(args.records)
    sizes = [len(r[0]) for r in records]
    result: dict[str, Any] = {
        "records": args.records,
        "value_bytes_median": statistics.median(sizes),
        "value_bytes_range": [min(sizes), max(sizes)],
        "codec": codec_part(records, args.rounds),
    }
    if not args.skip_e2e:
        with stack() as s:
            result["e2e"] = e2e_part(records, s.bootstrap, s.broker.process.pid, s.data_dir)
    save(args.name, result)


if __name__ == "__main__":
    main()
