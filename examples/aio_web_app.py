"""A small web service on sluice.aio: POST /orders produces, a background task consumes.

The shape a FastAPI or aiohttp service takes (here aiohttp, whose ``cleanup_ctx`` is FastAPI's
``lifespan``): the Client, the producer and the group consumer are made once when the app starts and
closed when it stops; the request handler awaits the acknowledgement of its record; the consumer
task commits what it processed, so a restart resumes after it.

    python examples/aio_web_app.py --bootstrap 127.0.0.1:7600 --port 8080
    curl -XPOST localhost:8080/orders -d '{"id": "o-1", "amount": 12}'
    curl localhost:8080/orders/processed
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator

from aiohttp import web

from sluice import aio
from sluice.errors import SluiceError, TopicAlreadyExists

CLIENT = web.AppKey("client", aio.Client)
PRODUCER = web.AppKey("producer", aio.Producer)
PROCESSED = web.AppKey("processed", list)
TOPIC = web.AppKey("topic", str)


async def post_order(request: web.Request) -> web.Response:
    try:
        order = await request.json()
        key = str(order["id"]).encode()
    except (ValueError, KeyError, TypeError):
        return web.json_response({"error": 'send a JSON object with an "id"'}, status=400)
    try:
        meta = await request.app[PRODUCER].send(json.dumps(order).encode(), key=key)
    except SluiceError as exc:  # typed: RequestTimedOut, NotEnoughReplicas, ...
        return web.json_response({"error": str(exc)}, status=503)
    return web.json_response({"partition": meta.partition, "offset": meta.offset}, status=201)


async def processed(request: web.Request) -> web.Response:
    return web.json_response(request.app[PROCESSED])


async def consume(consumer: aio.Consumer, done: list[str]) -> None:
    """The background task: process each order, commit what is processed."""
    async for record in consumer:
        done.append(json.loads(record.value)["id"])
        await consumer.commit()  # per record for the example; batch commits in a busy service


def create_app(bootstrap: str, topic: str = "orders", group: str = "order-service") -> web.Application:
    app = web.Application()
    app[TOPIC] = topic
    app[PROCESSED] = []

    async def sluice_lifespan(app: web.Application) -> AsyncIterator[None]:
        async with aio.Client(bootstrap) as client:
            with contextlib.suppress(TopicAlreadyExists):
                await client.admin.create_topic(topic, partitions=4)
            app[CLIENT] = client
            async with (
                client.producer(topic, linger="5ms") as producer,
                client.consumer(group, [topic], auto_offset_reset="earliest") as consumer,
            ):
                app[PRODUCER] = producer
                task = asyncio.create_task(consume(consumer, app[PROCESSED]))
                yield  # the app serves requests here
                task.cancel()  # cancelling the wait for a record loses none
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    app.cleanup_ctx.append(sluice_lifespan)
    app.router.add_post("/orders", post_order)
    app.router.add_get("/orders/processed", processed)
    return app


async def serve(bootstrap: str, host: str, port: int, topic: str, group: str) -> None:
    runner = web.AppRunner(create_app(bootstrap, topic, group))
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"listening on http://{host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()  # closes the consumer (final commit, leaves the group), producer, client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=None, help="coordinator host:port (default $SLUICE_BOOTSTRAP)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0: any free port (printed)")
    parser.add_argument("--topic", default="orders")
    parser.add_argument("--group", default="order-service")
    args = parser.parse_args()
    asyncio.run(serve(args.bootstrap, args.host, args.port, args.topic, args.group))


if __name__ == "__main__":
    main()
