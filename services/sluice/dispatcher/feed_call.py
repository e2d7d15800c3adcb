"""A feed's gRPC fetch call to a broker without a wire port (``feed.py``, "A broker without a wire port")."""

from __future__ import annotations

import asyncio

from sluice.errors import BrokerNotAvailable
from sluice.v1 import broker_pb2, broker_pb2_grpc

__all__ = ["FetchCall", "current_task_cancelling"]


def current_task_cancelling() -> bool:
    """Whether the running task itself is being cancelled (the feed stops), not just a fetch."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class FetchCall:
    """One open ``FetchStream`` to one broker: a request, then its answer, one at a time."""

    def __init__(self, broker: str, stub: broker_pb2_grpc.BrokerAsyncStub) -> None:
        self.broker = broker
        # No request iterator: requests are written with call.write() (grpc.aio allows it; the
        # stubs do not say so).
        self.call = stub.FetchStream()  # type: ignore[call-arg]

    async def fetch(self, request: broker_pb2.FetchRequest) -> broker_pb2.FetchResponse:
        await self.call.write(request)
        resp = await self.call.read()
        if not isinstance(resp, broker_pb2.FetchResponse):  # grpc.aio.EOF: the broker ended the call
            raise BrokerNotAvailable(f"broker {self.broker} ended the fetch stream")
        return resp

    def close(self) -> None:
        self.call.cancel()
