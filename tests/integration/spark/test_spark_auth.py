"""The Spark source against ``sluice up --tls --auth``: a batch read logging in with the ``username`` and
``password`` options (the driver plans, the executors read, each logging in with SCRAM over TLS); a wrong
password fails the read with UNAUTHENTICATED."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sluice import Client, TLSConfig
from tests.integration.cli.test_cli_system import Up, start_up

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def secure_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    stack = start_up(tmp_path_factory.mktemp("spark-up-auth") / "data", "--tls", "--auth")
    try:
        yield stack
    finally:
        stack.stop()


def _read(spark: Any, up: Up, topic: str, password: str) -> Any:
    return (
        spark.read.format("sluice")
        .option("bootstrap", up.bootstrap)
        .option("topic", topic)
        .option("tlsCa", str(up.data_dir.resolve() / "tls" / "ca.crt"))
        .option("username", "admin")
        .option("password", password)
        .load()
    )


def test_a_batch_read_with_username_and_password(spark: Any, secure_up: Up) -> None:
    password = (secure_up.data_dir / "admin.password").read_text().strip()
    tls = TLSConfig(ca=secure_up.data_dir / "tls" / "ca.crt")
    topic = f"spark-auth-{uuid.uuid4().hex[:6]}"
    with Client(secure_up.bootstrap, tls=tls, username="admin", password=password) as client:
        client.admin.create_topic(topic, partitions=2)
        with client.producer(topic, partitioner="round_robin") as producer:
            for i in range(50):
                producer.send(str(i).encode())
    rows = _read(spark, secure_up, topic, password).collect()
    assert sorted(int(r.value) for r in rows) == list(range(50))
    with pytest.raises(Exception, match="UNAUTHENTICATED"):
        _read(spark, secure_up, topic, "a-wrong-password").collect()
