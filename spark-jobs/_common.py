"""Shared bits of the example jobs: a SparkSession with the sluice source registered."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Running from a checkout: make the SDK importable without installing it.
_SERVICES = Path(__file__).resolve().parent.parent / "services"
if _SERVICES.is_dir() and str(_SERVICES) not in sys.path:
    sys.path.insert(0, str(_SERVICES))

from pyspark.sql import SparkSession  # noqa: E402

from sluice.spark import register  # noqa: E402


def session(app: str, master: str | None = None) -> SparkSession:
    builder = SparkSession.builder.appName(app)
    master = master or os.environ.get("SPARK_MASTER")
    if master:
        builder = builder.master(master)
    # Python workers must import the SDK too when running from a checkout.
    if _SERVICES.is_dir():
        path = os.pathsep.join(filter(None, [str(_SERVICES), os.environ.get("PYTHONPATH", "")]))
        os.environ["PYTHONPATH"] = path
        builder = builder.config("spark.executorEnv.PYTHONPATH", path)
    # Spark starts its Python workers with PYSPARK_PYTHON, else `python3` from PATH, which outside an
    # activated venv is the system's (no pyspark, no sluice): default to this very interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = builder.config("spark.sql.session.timeZone", "UTC").config("spark.ui.enabled", "false")
    spark = builder.getOrCreate()
    register(spark)
    return spark
