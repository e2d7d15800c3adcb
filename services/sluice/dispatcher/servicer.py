"""The Dispatcher gRPC servicer: protobuf <-> core calls (``convert.py``), nothing else.

Both transports run :meth:`DispatcherServicer._read` (the wire protocol through
:meth:`~DispatcherServicer.consume_into`), so the one rule kept here, the order of a Consume
stream's commands (Subscribe first, and only once), is written once; every value is validated
by the core (``service.py``, ``requests.py``).

``Consume`` is a bidirectional stream. A reader task takes client commands in order and calls the
service; the generator yields what the service queued for this stream (pre-encoded message batches
as ``bytes``, events as messages; :func:`add_to_server` registers a serializer that passes ``bytes``
through). Errors on an attached stream become ``Error`` events and the stream stays usable; a bad
first message or a failed Subscribe ends the stream after its ``Error`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import grpc
from grpc import aio

from sluice.common.wire import parse_frame
from sluice.dispatcher import convert
from sluice.dispatcher.convert import ack_ranges, by_partition, epoch_claims, subscribe_from_proto
from sluice.dispatcher.events import EventStream, Outgoing
from sluice.dispatcher.service import DispatcherService
from sluice.errors import ProtocolViolation, SluiceError
from sluice.quotas.client_id import with_client_id
from sluice.security.audit import audit_current
from sluice.security.context import RequestContext, current
from sluice.server.metrics import count_internal_error
from sluice.v1 import dispatcher_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["DispatcherServicer", "add_to_server"]

Context = aio.ServicerContext[Any, Any]


class PeerContext(Protocol):
    """What ``Consume`` needs of its gRPC context: the peer's address, and reading and writing the
    stream's messages (gRPC's reader/writer API)."""

    def peer(self) -> str: ...

    async def read(self) -> Any: ...

    async def write(self, message: Any) -> None: ...


async def _requests(context: PeerContext) -> AsyncIterator[pb.ConsumerCommand]:
    """The stream's commands, read from the context. Not gRPC's request iterator: its generator
    holds the last command while it waits for the next (see ``Consume``). The interceptor registers
    Consume with a pass-through deserializer (``sluice.server.decoding``), so commands arrive as bytes
    and are decoded here: undecodable ones end the stream with a typed error event, as on the wire."""
    while True:
        raw = await context.read()
        if not isinstance(raw, bytes | pb.ConsumerCommand):
            return  # grpc.aio.EOF: the client closed its side
        yield raw if isinstance(raw, pb.ConsumerCommand) else parse_frame(pb.ConsumerCommand, raw, "Consume")
        del raw


class DispatcherServicer:
    def __init__(self, service: DispatcherService) -> None:
        self._service = service

    @staticmethod
    def context(context: PeerContext) -> RequestContext:
        """The core's view of a gRPC caller: the context the interceptor built after authenticating
        it (``sluice.security.context.current``). The wire protocol's is built per connection, at the
        hello (``sluice.server.wire``), and given to :meth:`consume_into`. With the client id the call
        announces (``sluice-client-id``: the subscribe-rate quota counts anonymous callers by it)."""
        return with_client_id(current(), context)

    async def Consume(self, request_iterator: object, context: PeerContext) -> None:
        """The gRPC Consume stream, on gRPC's reader/writer API rather than as an async generator:
        gRPC's loop over a handler's generator (``async for response in ...: await write(response)``)
        and its request iterator each hold their last message while waiting for the next. For a
        consumer that took a burst that is its last MessageBatch (~115 KB) and its last Ack by
        ranges (~40 KB of upb arena) kept for as long as the stream is open (docs/dispatcher.md,
        "What a subscription costs"). ``request_iterator`` is not used: commands are read from
        ``context`` (``_requests``)."""
        queue: asyncio.Queue[Outgoing] = asyncio.Queue()
        stream = EventStream(context.peer(), queue.put_nowait)
        ctx = self.context(context)
        reader = asyncio.create_task(self._read(ctx, _requests(context), stream), name="consume-reader")
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                await context.write(item)
                del item  # not held while the next event is awaited
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            self._service.disconnect(stream)

    async def consume_into(
        self,
        ctx: RequestContext,
        commands: AsyncIterator[pb.ConsumerCommand],
        peer: str,
        sink: Callable[[Outgoing], None],
    ) -> None:
        """``Consume`` for a transport that writes events itself (the wire protocol): each event
        goes to ``sink`` as the service sends it, ``None`` last, with no queue or task between.
        Returns when the stream ended (the commands ended, or the service ended the stream)."""
        stream = EventStream(peer, sink)
        try:
            await self._read(ctx, commands, stream)
        finally:
            stream.close()
            self._service.disconnect(stream)

    async def _read(
        self, ctx: RequestContext, commands: AsyncIterator[pb.ConsumerCommand], stream: EventStream
    ) -> None:
        try:
            async for cmd in commands:
                ended = await self._command(ctx, stream, cmd)
                # Not kept while the next command is awaited: a parsed command holds its whole upb
                # arena, and an Ack by ranges after a burst is ~40 KB of C memory that tracemalloc
                # does not see (docs/dispatcher.md, "What a subscription costs").
                del cmd
                if ended:
                    return
        except asyncio.CancelledError:
            raise
        except SluiceError as err:  # an undecodable command (_requests)
            stream.fail(err)
        except (grpc.RpcError, aio.AioRpcError) as exc:
            log.debug("consume stream from %s ended: %s", stream.peer, exc)
        except Exception:
            log.exception("consume stream from %s failed", stream.peer)
            count_internal_error("dispatcher", "Consume")
        finally:
            stream.close()

    async def _command(self, ctx: RequestContext, stream: EventStream, cmd: pb.ConsumerCommand) -> bool:
        """Carry out one command; True when the stream must end (a failed or missing Subscribe)."""
        service = self._service
        kind = cmd.WhichOneof("command")
        if stream.consumer is None:
            if kind != "subscribe":
                stream.fail(
                    ProtocolViolation(
                        f"the first message of a Consume stream must be Subscribe, got {kind or 'nothing'}"
                    )
                )
                return True
            try:
                await service.subscribe(ctx, stream, subscribe_from_proto(cmd.subscribe))
            except SluiceError as err:
                stream.fail(err)
                return True
            return False
        try:
            if kind == "flow":
                service.flow(ctx, stream, cmd.flow.permits)
            elif kind == "ack":
                ack = cmd.ack
                claims = epoch_claims(ack.ids, ack.ranges)
                service.ack(ctx, stream, by_partition(ack.ids), ack_ranges(ack), ack.cumulative, claims)
            elif kind == "nack":
                ids = cmd.nack.ids
                service.nack(ctx, stream, by_partition(ids), epoch_claims(ids))
            elif kind == "subscribe":
                raise ProtocolViolation(
                    "this stream is already subscribed; open another stream for another subscription"
                )
            else:
                raise ProtocolViolation("empty ConsumerCommand")
        except SluiceError as err:
            stream.error(err)
        return False

    async def ListSubscriptions(
        self, request: pb.ListSubscriptionsRequest, context: Context
    ) -> pb.ListSubscriptionsResponse:
        rows = await self._service.views.list_all(self.context(context), request.topic)
        return convert.list_to_proto(rows)

    async def DescribeSubscription(
        self, request: pb.DescribeSubscriptionRequest, context: Context
    ) -> pb.DescribeSubscriptionResponse:
        found = await self._service.views.describe(self.context(context), request.topic, request.subscription)
        return convert.describe_to_proto(found)

    async def ResetSubscription(
        self, request: pb.ResetSubscriptionRequest, context: Context
    ) -> pb.ResetSubscriptionResponse:
        done = await self._service.admin.reset(self.context(context), convert.reset_from_proto(request))
        audit_current("subscription.reset", {"topic": request.topic, "subscription": request.subscription})
        return convert.reset_to_proto(done)

    async def SkipSubscription(
        self, request: pb.SkipSubscriptionRequest, context: Context
    ) -> pb.SkipSubscriptionResponse:
        done = await self._service.admin.skip(self.context(context), convert.skip_from_proto(request))
        audit_current("subscription.skip", {"topic": request.topic, "subscription": request.subscription})
        return convert.skip_to_proto(done)

    async def DeleteSubscription(
        self, request: pb.DeleteSubscriptionRequest, context: Context
    ) -> pb.DeleteSubscriptionResponse:
        done = await self._service.admin.delete(self.context(context), convert.delete_from_proto(request))
        audit_current("subscription.delete", {"topic": request.topic, "subscription": request.subscription})
        return convert.delete_to_proto(done)

    async def PeekSubscription(
        self, request: pb.PeekSubscriptionRequest, context: Context
    ) -> pb.PeekSubscriptionResponse:
        done = await self._service.admin.peek(self.context(context), convert.peek_from_proto(request))
        return convert.peek_to_proto(done)

    async def ListParkedKeys(
        self, request: pb.ListParkedKeysRequest, context: Context
    ) -> pb.ListParkedKeysResponse:
        keys = await self._service.parked.list(
            self.context(context), request.topic, request.subscription, context.time_remaining()
        )
        return convert.parked_to_proto(keys)

    async def UnparkKey(self, request: pb.UnparkKeyRequest, context: Context) -> pb.UnparkKeyResponse:
        found, released = await self._service.parked.unpark(
            self.context(context), request.topic, request.subscription, request.key, context.time_remaining()
        )
        audit_current("subscription.unpark", {"topic": request.topic, "subscription": request.subscription})
        return pb.UnparkKeyResponse(found=found, released=released)


def _serialize_event(item: bytes | pb.DispatcherEvent) -> bytes:
    return item if isinstance(item, bytes) else item.SerializeToString()


def add_to_server(servicer: DispatcherServicer, server: aio.Server) -> None:
    """Like the generated ``add_DispatcherServicer_to_server``, with a bytes-friendly Consume serializer."""
    handlers = {
        "Consume": grpc.stream_stream_rpc_method_handler(
            servicer.Consume,
            request_deserializer=pb.ConsumerCommand.FromString,
            response_serializer=_serialize_event,
        ),
        "ListSubscriptions": grpc.unary_unary_rpc_method_handler(
            servicer.ListSubscriptions,
            request_deserializer=pb.ListSubscriptionsRequest.FromString,
            response_serializer=pb.ListSubscriptionsResponse.SerializeToString,
        ),
        "DescribeSubscription": grpc.unary_unary_rpc_method_handler(
            servicer.DescribeSubscription,
            request_deserializer=pb.DescribeSubscriptionRequest.FromString,
            response_serializer=pb.DescribeSubscriptionResponse.SerializeToString,
        ),
        **{
            name: grpc.unary_unary_rpc_method_handler(
                getattr(servicer, name),
                request_deserializer=getattr(pb, f"{name}Request").FromString,
                response_serializer=getattr(pb, f"{name}Response").SerializeToString,
            )
            for name in (
                "ResetSubscription",
                "SkipSubscription",
                "DeleteSubscription",
                "PeekSubscription",
                "ListParkedKeys",
                "UnparkKey",
            )
        },
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("sluice.v1.Dispatcher", handlers),))
