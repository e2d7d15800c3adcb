"""PySpark data source: ``spark.read.format("sluice")`` and ``spark.readStream.format("sluice")``.

Register it once per session::

    from sluice.spark import register
    register(spark)
    df = spark.read.format("sluice").option("bootstrap", "127.0.0.1:7600").option("topic", "orders").load()

Spark plans offsets in a Python worker that the JVM starts, not in the driver's
Python process, so everything the source needs travels in its options.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Register the ``sluice`` format with a SparkSession."""
    from sluice.spark.source import SluiceDataSource

    spark.dataSource.register(SluiceDataSource)
