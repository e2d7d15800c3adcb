"""The producer: batching, partitioning, a background sender, per-record futures."""

from sluice.client.producer.config import ProducerConfig
from sluice.client.producer.futures import FutureRecordMetadata, FutureRecordsMetadata, RecordMetadata
from sluice.client.producer.partitioner import key_partition
from sluice.client.producer.producer import Producer

__all__ = [
    "FutureRecordMetadata",
    "FutureRecordsMetadata",
    "Producer",
    "ProducerConfig",
    "RecordMetadata",
    "key_partition",
]
