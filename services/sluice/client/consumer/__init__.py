"""The group (pull) consumer: ``client.consumer(group, subscribe, ...)``.

Parts (each a module of its own): ``config`` (ConsumerConfig), ``membership`` (the
member's protocol state machine, pure), ``member`` (the heartbeat coroutine),
``group_driver`` (the Client's one event loop that runs every member's),
``state`` (assignment snapshot and partition positions), ``prefetch`` (the fetch
steps and the bounded buffer), ``fetch_driver`` (the Client's one thread that runs
every consumer's fetch steps), ``commits`` (the offset-store client),
``async_commits`` (coalesced, bounded, retried asynchronous commits) and
``consumer`` (the façade).
"""

from sluice.client.consumer.async_commits import CommitStats
from sluice.client.consumer.config import ConsumerConfig, RebalanceListener, subscription_of
from sluice.client.consumer.consumer import CommitCallback, Consumer, ConsumerStats

__all__ = [
    "CommitCallback",
    "CommitStats",
    "Consumer",
    "ConsumerConfig",
    "ConsumerStats",
    "RebalanceListener",
    "subscription_of",
]
