"""Spark batch read through the sluice data source: records/s after start-up, and Spark's fixed cost.

1,000,000 records of 100 bytes over 4 partitions, ``local[2]``. The fixed cost is
the same query over a one-record topic (planning, task scheduling, Python worker
start), measured after a warm-up; throughput is reported both raw and net of it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from _stack import ROOT, save, stack

VALUE = b"x" * 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = str(ROOT / "services")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from sluice import Client
    from sluice.spark import register

    with stack() as s:
        with Client(s.bootstrap) as client:
            client.admin.create_topic("spark-bench", partitions=4)
            client.admin.create_topic("spark-tiny", partitions=4)
            with client.producer("spark-bench") as producer:
                keys = [os.urandom(8).hex().encode() for _ in range(1024)]
                for i in range(args.records):
                    producer.send(VALUE, key=keys[i & 1023])
                producer.flush()
            with client.producer("spark-tiny") as producer:
                producer.send(VALUE)
                producer.flush()
        started = time.perf_counter()
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.executorEnv.PYTHONPATH", str(ROOT / "services"))
            .getOrCreate()
        )
        register(spark)
        session_s = time.perf_counter() - started

        def run(topic: str) -> tuple[float, int]:
            t0 = time.perf_counter()
            df = spark.read.format("sluice").option("bootstrap", s.bootstrap).option("topic", topic).load()
            row = df.selectExpr("count(*) as n", "sum(length(value)) as b").collect()[0]
            return time.perf_counter() - t0, int(row.n)

        run("spark-tiny")  # warm-up: JVM JIT, Python workers
        fixed_s = min(run("spark-tiny")[0] for _ in range(3))
        elapsed, n = run("spark-bench")
        spark.stop()
    assert n == args.records, n
    save(
        "spark_read",
        {
            "records": n,
            "session_start_s": round(session_s, 2),
            "fixed_query_overhead_s": round(fixed_s, 2),
            "query_s": round(elapsed, 2),
            "records_per_s": round(n / elapsed),
            "records_per_s_after_fixed_overhead": round(n / max(elapsed - fixed_s, 1e-9)),
        },
    )


if __name__ == "__main__":
    main()
