"""The Spark source's executor read path (``read_range``) with ``filterType=sql``, against a real
broker: the Arrow batches hold exactly the matching records (no Spark session needed for this)."""

from __future__ import annotations

from sluice.spark.options import parse_options
from sluice.spark.planning import OffsetRange
from sluice.spark.reading import read_range
from tests.integration.consumer.conftest import Cluster


def test_spark_read_range_applies_an_sql_filter(cluster: Cluster) -> None:
    topic = cluster.topic(1, "sqlspark")
    with cluster.client().producer(topic) as p:
        for i in range(300):
            p.send(str(i).encode(), headers={"n": str(i).encode(), "kind": b"even" if i % 2 == 0 else b"odd"})
    sql = "kind = 'odd' AND n >= 200"
    options = parse_options(
        {"bootstrap": cluster.bootstrap, "topic": topic, "filter": sql, "filterType": "sql"}, streaming=False
    )
    offsets: list[int] = []
    for batch in read_range(OffsetRange(topic, 0, 0, 300), options):
        offsets += batch.column("offset").to_pylist()
    assert offsets == [i for i in range(200, 300) if i % 2]
