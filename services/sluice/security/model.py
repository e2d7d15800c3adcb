"""The vocabulary of security: who (``Principal``), on what (``Resource``), does what (``Operation``).

Kafka's ACL model, with Sluice's resource types: a topic, a consumer group, a push subscription, the
cluster. Every check anywhere (an interceptor, a broker's core, the dispatcher) speaks these types, so a
rule has one spelling.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "ANONYMOUS",
    "CLUSTER_RESOURCE",
    "IMPLIED",
    "Operation",
    "Principal",
    "Resource",
    "ResourceType",
]


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller.

    ``name`` is what ACLs and super-user lists name: a user (``alice``), a certificate's mapped
    subject, a JWT's principal claim (``system:serviceaccount:spark:executor``). Empty: anonymous.
    ``mechanism`` is how it was established (``scram``, ``jwt``, ``mtls``, ``cluster``, ``""``), for the
    audit log. ``cluster`` marks a Sluice service authenticated with the cluster token or a cluster
    certificate: it may call internal RPCs.
    """

    name: str = ""
    mechanism: str = ""
    cluster: bool = False

    @property
    def anonymous(self) -> bool:
        return not self.name


ANONYMOUS = Principal()


class ResourceType(enum.Enum):
    TOPIC = "topic"
    GROUP = "group"
    SUBSCRIPTION = "subscription"
    CLUSTER = "cluster"


class Operation(enum.Enum):
    """What a request does to a resource (Kafka's ACL operations)."""

    READ = "read"
    WRITE = "write"
    CREATE = "create"
    DELETE = "delete"
    ALTER = "alter"
    DESCRIBE = "describe"
    DESCRIBE_CONFIGS = "describe_configs"
    ALTER_CONFIGS = "alter_configs"
    CLUSTER_ACTION = "cluster_action"


#: An ACL allowing the key allows these too (Kafka: read, write, delete and alter imply describe;
#: alter_configs implies describe_configs). A deny is not widened this way.
IMPLIED: dict[Operation, frozenset[Operation]] = {
    Operation.READ: frozenset({Operation.DESCRIBE}),
    Operation.WRITE: frozenset({Operation.DESCRIBE}),
    Operation.DELETE: frozenset({Operation.DESCRIBE}),
    Operation.ALTER: frozenset({Operation.DESCRIBE}),
    Operation.ALTER_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS}),
}


@dataclass(frozen=True, slots=True)
class Resource:
    type: ResourceType
    #: The topic, group or subscription name; ``""`` for the cluster.
    name: str = ""

    def __str__(self) -> str:
        return f"{self.type.value}:{self.name}" if self.name else self.type.value


CLUSTER_RESOURCE = Resource(ResourceType.CLUSTER)
