"""Batch job: copy a topic's offset range to Parquet, partitioned by date.

    python spark-jobs/export.py --bootstrap 127.0.0.1:7600 --topic orders --output /tmp/orders_export \
        [--starting-offsets earliest] [--ending-offsets latest] [--filter 'tagA || tagB']
"""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F

from _common import session


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", default="127.0.0.1:7600")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--starting-offsets", default="earliest")
    parser.add_argument("--ending-offsets", default="latest")
    parser.add_argument("--filter", default="*")
    parser.add_argument("--max-records-per-partition", type=int, default=1_000_000)
    parser.add_argument("--master")
    args = parser.parse_args(argv)
    spark = session("sluice-export", args.master)
    df = (
        spark.read.format("sluice")
        .option("bootstrap", args.bootstrap)
        .option("topic", args.topic)
        .option("startingOffsets", args.starting_offsets)
        .option("endingOffsets", args.ending_offsets)
        .option("filter", args.filter)
        .option("maxRecordsPerPartition", str(args.max_records_per_partition))
        .load()
    )
    (
        df.withColumn("date", F.to_date("timestamp"))
        .write.mode("overwrite")
        .partitionBy("date")
        .parquet(args.output)
    )


if __name__ == "__main__":
    main()
