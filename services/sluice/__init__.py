"""Sluice: a partitioned log with Kafka-style pull groups and Pulsar-style push subscriptions.

The SDK's entry point is :class:`Client`::

    from sluice import Client
    client = Client("127.0.0.1:7600")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluice.client.client import Client
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

# Every name loads on first use (PEP 562): each process imports ``sluice`` first (a service, a
# ``sluice`` sub-command, the SDK), and none should pay for the batch codec, the ACL grammar or the
# gRPC SDK before it needs them (docs/testing.md: start-up CPU is most of the suite's time).
_WHERE = {
    "ALL": "sluice.security.acl",
    "AclEntry": "sluice.security.acl",
    "AclFilter": "sluice.security.acl",
    "Client": "sluice.client.client",
    "Operation": "sluice.security.model",
    "PatternType": "sluice.security.acl",
    "Permission": "sluice.security.acl",
    "Record": "sluice.codec.batch",
    "ResourceType": "sluice.security.model",
    "SluiceError": "sluice.errors",
    "TLSConfig": "sluice.common.client_security",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'sluice' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
