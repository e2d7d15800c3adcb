"""The client id a gRPC caller announces: whom a quota counts an anonymous caller as (docs/quotas.md).

The wire protocol carries it in the hello (``WireHello.client_id``, kept in the connection's
``RequestContext``); a gRPC call carries it as the metadata ``sluice-client-id``.
"""

from __future__ import annotations

import dataclasses

from sluice.quotas.model import MAX_NAME
from sluice.security.context import RequestContext

__all__ = ["CLIENT_ID_METADATA", "with_client_id"]

#: The gRPC metadata key a client announces its client id with (the wire hello's ``client_id``).
CLIENT_ID_METADATA = "sluice-client-id"


def with_client_id(ctx: RequestContext, grpc_context: object) -> RequestContext:
    """``ctx`` with the client id a gRPC call announces in its metadata; ``ctx`` itself when it
    announces none (or already has one)."""
    metadata = getattr(grpc_context, "invocation_metadata", None)
    if metadata is None or ctx.client_id:
        return ctx
    for key, value in metadata() or ():
        if key == CLIENT_ID_METADATA and isinstance(value, str) and value:
            return dataclasses.replace(ctx, client_id=value[:MAX_NAME])
    return ctx
