"""What a caller may see of the coordinator's lists: topics and groups it may describe.

A list is filtered, never refused (Kafka's Metadata and ListGroups): a caller sees the resources it
may describe and nothing tells it the others exist. A topic named in a Metadata request that the
caller may not describe comes back in ``unauthorized_topics`` whether or not it exists, so the
answer does not reveal existence either.
"""

from __future__ import annotations

from sluice.errors import AuthorizationError
from sluice.security.context import allowed, current, process_authorizer
from sluice.security.model import Operation, Resource, ResourceType
from sluice.v1 import coordinator_pb2 as pb

__all__ = ["authorize_idempotent_write", "may_describe_group", "may_describe_topic", "visible_metadata"]


def may_describe_topic(name: str) -> bool:
    return allowed(Operation.DESCRIBE, Resource(ResourceType.TOPIC, name))


def may_describe_group(name: str) -> bool:
    return allowed(Operation.DESCRIBE, Resource(ResourceType.GROUP, name))


def visible_metadata(response: pb.MetadataResponse, named: list[str]) -> pb.MetadataResponse:
    """``response`` with the topics the caller may not describe taken out (named ones reported in
    ``unauthorized_topics``)."""
    if not getattr(process_authorizer(), "enabled", False):
        return response
    hidden = {t.name for t in response.topics if not may_describe_topic(t.name)}
    hidden |= {name for name in response.unknown_topics if not may_describe_topic(name)}
    if not hidden:
        return response
    kept = [t for t in response.topics if t.name not in hidden]
    unknown = [n for n in response.unknown_topics if n not in hidden]
    del response.topics[:]
    response.topics.extend(kept)
    del response.unknown_topics[:]
    response.unknown_topics.extend(unknown)
    response.unauthorized_topics.extend(sorted(hidden & set(named)))
    return response


def authorize_idempotent_write() -> None:
    """An idempotent producer's id: allowed to a caller that may write to some topic (Kafka's
    KIP-679: idempotence is the producer's default, so the right to write implies it)."""
    authorizer = process_authorizer()
    some = getattr(authorizer, "allowed_on_some", None)
    if some is None or some(current(), Operation.WRITE, ResourceType.TOPIC):
        return
    who = current().principal.name or "an anonymous caller"
    raise AuthorizationError(f"{who} is not authorized to write to any topic (an idempotent producer's id)")
