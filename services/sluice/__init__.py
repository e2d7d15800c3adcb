"""Sluice: a partitioned log with Kafka-style pull groups and Pulsar-style push subscriptions.

The SDK's entry point is :class:`Client`::

    from sluice import Client
    client = Client("127.0.0.1:7600")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sluice.codec.batch import Record
from sluice.common.client_security import TLSConfig
from sluice.errors import SluiceError
from sluice.security.acl import ALL, AclEntry, AclFilter, PatternType, Permission
from sluice.security.model import Operation, ResourceType

__all__ = [
    "ALL",
    "DEFAULT_BOOTSTRAP",
    "AclEntry",
    "AclFilter",
    "Client",
    "Operation",
    "PatternType",
    "Permission",
    "Record",
    "ResourceType",
    "SluiceError",
    "TLSConfig",
]

DEFAULT_BOOTSTRAP = "127.0.0.1:7600"

if TYPE_CHECKING:
    from sluice.client.client import Client


def __getattr__(name: str) -> Any:
    # The SDK pulls in gRPC channels; services that import sluice.errors do not need it.
    if name == "Client":
        from sluice.client.client import Client

        return Client
    raise AttributeError(name)
