"""The Sluice Python SDK. Start from :class:`sluice.Client`.

The names below load on first use (PEP 562): importing one submodule (``sluice.client.metadata``
for a ``sluice topic`` sub-command, say) must not pull in the whole SDK, gRPC aio, the consumer
and the push client; every ``sluice`` process paid ~0.3 s of CPU for that (docs/testing.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluice.client.client import DEFAULT_BOOTSTRAP, Client
    from sluice.client.consumer.offset_reset import OffsetResetRow, ResetTo
    from sluice.client.fetcher import Fetcher
    from sluice.client.metadata import BrokerInfo, ClusterMetadata, PartitionInfo, TopicInfo
    from sluice.client.producer import FutureRecordMetadata, Producer, ProducerConfig, RecordMetadata
    from sluice.common.client_security import TLSConfig

_WHERE = {
    "DEFAULT_BOOTSTRAP": "sluice.client.client",
    "Client": "sluice.client.client",
    "OffsetResetRow": "sluice.client.consumer.offset_reset",
    "ResetTo": "sluice.client.consumer.offset_reset",
    "Fetcher": "sluice.client.fetcher",
    "BrokerInfo": "sluice.client.metadata",
    "ClusterMetadata": "sluice.client.metadata",
    "PartitionInfo": "sluice.client.metadata",
    "TopicInfo": "sluice.client.metadata",
    "FutureRecordMetadata": "sluice.client.producer",
    "Producer": "sluice.client.producer",
    "ProducerConfig": "sluice.client.producer",
    "RecordMetadata": "sluice.client.producer",
    "TLSConfig": "sluice.common.client_security",
}

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


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'sluice.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
