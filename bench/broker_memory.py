"""Broker RSS while the log grows: it must stay flat, not grow with the data on disk."""

from __future__ import annotations

import argparse
import os
import time

from _stack import rss_mb, save, stack

VALUE = b"x" * 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=10_000_000)
    args = parser.parse_args()
    samples: list[tuple[int, float]] = []
    with stack(flush="never") as s:
        from sluice import Client

        pid = s.broker.process.pid
        with Client(s.bootstrap) as client:
            client.admin.create_topic("mem", partitions=4)
            producer = client.producer("mem")
            keys = [os.urandom(8).hex().encode() for _ in range(1024)]
            started = time.perf_counter()
            step = max(1, args.records // 10)
            for i in range(args.records):
                producer.send(VALUE, key=keys[i & 1023])
                if (i + 1) % step == 0:
                    producer.flush()
                    samples.append((i + 1, round(rss_mb(pid), 1)))
                    print(f"{i + 1:>12,} records  broker RSS {samples[-1][1]} MB", flush=True)
            producer.close()
            elapsed = time.perf_counter() - started
        disk = sum(f.stat().st_size for f in (s.data_dir / "broker").rglob("*") if f.is_file())
    save(
        "broker_memory",
        {
            "records": args.records,
            "log_bytes_on_disk": disk,
            "rss_mb_samples": samples,
            "max_rss_mb": max(r for _, r in samples),
            "produce_rps": round(args.records / elapsed),
        },
    )


if __name__ == "__main__":
    main()
