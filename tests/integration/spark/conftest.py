"""A real Sluice stack and a local Spark session for the data-source tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sluice.client.client import Client
from tests.harness import SERVICES, ServiceProcess, free_port, run_redis, start_service

#: For every JVM the Spark tests start: short queries on small data, where JIT warm-up and GC threads
#: cost more than they give on a 2-core machine (docs/testing.md, "Test-suite budget").
SPARK_JAVA_OPTS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"


@dataclass
class Stack:
    bootstrap: str
    coordinator: ServiceProcess
    broker: ServiceProcess
    #: The broker's data directory (a test may read the stored batches).
    data_dir: Path


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data = tmp_path_factory.mktemp("spark-stack")
    with run_redis(appendonly=False) as redis:
        store_port = free_port()
        coord = start_service(
            "coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url,
            "--offset-store", f"127.0.0.1:{store_port}",
        )  # fmt: skip
        broker = start_service(
            "broker",
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--broker-id",
            "0",
            "--data-dir",
            str(data / "broker"),
            "--coordinator",
            coord.address,
            "--retention-check-interval",
            "200ms",
        )
        store = start_service(
            "offset-store", "--port", str(store_port), "--metrics-port", "0", "--redis-url", redis.url,
            "--coordinator", coord.address,
        )  # fmt: skip
        try:
            yield Stack(coord.address, coord, broker, data / "broker")
        finally:
            store.terminate()
            broker.terminate()
            coord.terminate()


@pytest.fixture(scope="package")
def client(stack: Stack) -> Iterator[Client]:
    with Client(stack.bootstrap) as c:
        yield c


@pytest.fixture(scope="package")
def spark() -> Iterator[object]:
    from pyspark.sql import SparkSession

    from sluice.spark import register

    # Spark's Python workers must import the SDK from the source tree.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SERVICES), os.environ.get("PYTHONPATH", "")])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("sluice-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        # Small-data settings: one shuffle partition (one task and one state store per stateful
        # micro-batch instead of two), no console progress bars; the JVM with the serial GC and the
        # client compiler only (start-up and short queries dominate here, not long-running hot loops).
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", SPARK_JAVA_OPTS)
        .config("spark.executorEnv.PYTHONPATH", str(SERVICES))
        .getOrCreate()
    )
    register(session)
    try:
        yield session
    finally:
        session.stop()


def jobs_dir() -> Path:
    return Path(__file__).resolve().parents[3] / "spark-jobs"
