"""What the runner needs of a system: where its server is, how to make a fresh destination, and a
producer and a consumer that run in their own processes (plain functions or coroutines)."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass

from compare.workload import Feed, Sink

#: The endpoint of a started server, as the adapters read it (``url``, ``bootstrap``, ``brokers``).
Endpoint = dict[str, str]


@dataclass
class Adapter:
    """One configuration of one system.

    ``name``: its id in results and plots; ``label``: how figures name it; ``durability``: what an
    acknowledged record survives under it (on every figure); ``server``: which started server it uses
    (runner.SERVERS); ``pair``: the Sluice configuration its ratios are taken against (same
    durability class); ``sluice``: whether it is one of Sluice's own.
    """

    name: str
    label: str
    durability: str
    server: str
    pair: str = ""
    sluice: bool = False

    def prepare(self, endpoint: Endpoint, dest: str) -> None:
        """Create the topic/stream/queue ``dest`` (in the runner's process, before both sides start)."""
        raise NotImplementedError

    def cleanup(self, endpoint: Endpoint, dest: str) -> None:
        """Delete ``dest`` after its run, so the next run's memory figure does not carry this one's data."""

    def produce(self, endpoint: Endpoint, dest: str, feed: Feed) -> Awaitable[None] | None:
        """Send every record ``feed`` hands out, calling ``feed.acked`` as acknowledgements arrive;
        return once all are acknowledged."""
        raise NotImplementedError

    def consume(self, endpoint: Endpoint, dest: str, sink: Sink) -> Awaitable[None] | None:
        """Read ``dest`` from its start, ``sink.add`` every record, acknowledge them, until
        ``sink.finished()`` (checked at least every second)."""
        raise NotImplementedError
