"""The base of the fake brokers that tests put behind a real coordinator.

The coordinator calls a broker only through ``UpdatePartitions``; a fake serves that and leaves the
data-plane RPCs unimplemented. The generated stubs declare every servicer method abstract, so this
base spells the five data-plane RPCs out with the generated servicer's own default (status
UNIMPLEMENTED, ``NotImplementedError``): a fake keeps the behaviour it always had and type-checks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, NoReturn

import grpc
from grpc import aio

from sluice.v1 import broker_pb2, broker_pb2_grpc

Context = grpc.ServicerContext | aio.ServicerContext[Any, Any]


def _unimplemented(context: Context) -> NoReturn:
    context.set_code(grpc.StatusCode.UNIMPLEMENTED)
    context.set_details("Method not implemented!")
    raise NotImplementedError("Method not implemented!")


class CoordinatorFacingBroker(broker_pb2_grpc.BrokerServicer):
    """A broker servicer without a data plane: subclasses implement ``UpdatePartitions``."""

    def Produce(self, request: broker_pb2.ProduceRequest, context: Context) -> NoReturn:
        _unimplemented(context)

    def Fetch(self, request: broker_pb2.FetchRequest, context: Context) -> NoReturn:
        _unimplemented(context)

    def ProduceStream(
        self,
        request_iterator: Iterator[broker_pb2.ProduceRequest] | AsyncIterator[broker_pb2.ProduceRequest],
        context: Context,
    ) -> NoReturn:
        _unimplemented(context)

    def FetchStream(
        self,
        request_iterator: Iterator[broker_pb2.FetchRequest] | AsyncIterator[broker_pb2.FetchRequest],
        context: Context,
    ) -> NoReturn:
        _unimplemented(context)

    def ListOffsets(self, request: broker_pb2.ListOffsetsRequest, context: Context) -> NoReturn:
        _unimplemented(context)

    def OffsetForLeaderEpoch(
        self, request: broker_pb2.OffsetForLeaderEpochRequest, context: Context
    ) -> NoReturn:
        _unimplemented(context)
