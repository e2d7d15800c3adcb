"""Streaming job: records per tag and minute, with a watermark, written to Parquet.

    python spark-jobs/tag_counts.py --bootstrap 127.0.0.1:7600 --topic orders \
        --output /tmp/tag_counts --checkpoint /tmp/tag_counts_ckpt [--available-now]

Windows are emitted (append mode) once the watermark passes their end, so every
row in the output is final: one row per (minute, tag) with its exact count.
"""

from __future__ import annotations

import argparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from _common import session


def build(
    spark: SparkSession, bootstrap: str, topic: str, watermark: str, options: dict[str, str]
) -> DataFrame:
    stream = (
        spark.readStream.format("sluice")
        .option("bootstrap", bootstrap)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .options(**options)
        .load()
    )
    return (
        stream.withWatermark("timestamp", watermark)
        .groupBy(F.window("timestamp", "1 minute").alias("window"), F.coalesce("tag", F.lit("")).alias("tag"))
        .count()
        .select(F.col("window.start").alias("minute"), "tag", "count")
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", default="127.0.0.1:7600")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--output", help="Parquet directory (default: print to the console)")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--watermark", default="1 minute")
    parser.add_argument("--available-now", action="store_true", help="process what exists, then stop")
    parser.add_argument("--max-records-per-trigger", type=int)
    parser.add_argument("--master")
    args = parser.parse_args(argv)
    spark = session("sluice-tag-counts", args.master)
    extra = {}
    if args.max_records_per_trigger:
        extra["maxRecordsPerTrigger"] = str(args.max_records_per_trigger)
    counts = build(spark, args.bootstrap, args.topic, args.watermark, extra)
    writer = counts.writeStream.outputMode("append").option("checkpointLocation", args.checkpoint)
    writer = writer.format("parquet").option("path", args.output) if args.output else writer.format("console")
    writer = (
        writer.trigger(availableNow=True)
        if args.available_now
        else writer.trigger(processingTime="10 seconds")
    )
    writer.start().awaitTermination()


if __name__ == "__main__":
    main()
