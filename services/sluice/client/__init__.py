"""The Sluice Python SDK. Start from :class:`sluice.Client`."""

from sluice.client.client import DEFAULT_BOOTSTRAP, Client
from sluice.client.consumer.offset_reset import OffsetResetRow, ResetTo
from sluice.client.fetcher import Fetcher
from sluice.client.metadata import BrokerInfo, ClusterMetadata, PartitionInfo, TopicInfo
from sluice.client.producer import FutureRecordMetadata, Producer, ProducerConfig, RecordMetadata
from sluice.common.client_security import TLSConfig

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "BrokerInfo",
    "Client",
    "ClusterMetadata",
    "Fetcher",
    "FutureRecordMetadata",
    "OffsetResetRow",
    "PartitionInfo",
    "Producer",
    "ProducerConfig",
    "RecordMetadata",
    "ResetTo",
    "TLSConfig",
    "TopicInfo",
]
