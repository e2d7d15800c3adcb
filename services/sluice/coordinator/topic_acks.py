"""What CreateTopic, AddPartitions and DeleteTopic answer when a broker does not apply the change.

The change is recorded first (Redis, then the state), then pushed; the call waits (bounded) for the hosting
brokers' acknowledgements. A broker that answers it could not apply the change (it could not create the log)
makes the call fail with ``BROKER_UPDATE_FAILED``, naming each broker and its reason: the topic exists in the
metadata but is not (yet) usable everywhere. A broker that did not answer (unreachable, deadline passed even
after its next heartbeat, not alive) makes it a degraded success: OK, with the broker listed in the answer's
``unacknowledged`` (``BROKER_NOT_AVAILABLE`` each), as its heartbeats bring it the change. The brokers keep
reconciling on their own (every heartbeat of a broker behind the coordinator's version brings its full
assignment), and a call that failed is safe to retry:

- CreateTopic of a topic whose creation this coordinator reported incomplete, with the same partition count
  and config, pushes the topic's partitions again (a new metadata version) and waits: OK once every hosting
  broker applied it. With another spec it answers TOPIC_ALREADY_EXISTS, as for any existing topic.
- AddPartitions to the count a reported-incomplete growth asked for does the same (otherwise a count that
  is not larger is INVALID_PARTITIONS, as before).
- DeleteTopic of a topic whose deletion was reported incomplete pushes the removals again and waits.

Soft state: kept until the topic's change is acknowledged, the topic is deleted or re-created, or the
coordinator restarts (then a retry answers as for a complete topic, and heartbeats still reconcile). Caller:
the service layer, under the write lock for ``lookup``/``record``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sluice.coordinator.broker_updates import PushFailure, PushOutcome
from sluice.coordinator.cluster.model import PartitionRef, TopicConfig
from sluice.errors import BrokerNotAvailable, BrokerUpdateFailed, SluiceError

__all__ = ["Incomplete", "IncompleteTopics", "settle", "wait_for_brokers"]


@dataclass(frozen=True)
class Incomplete:
    """A topic change some broker did not acknowledge."""

    #: "create" (CreateTopic or AddPartitions) or "delete".
    kind: str
    topic_id: str
    partitions: int
    config: TopicConfig
    #: For a deletion: the removals per broker, to push again on a retry.
    removals: Mapping[int, tuple[PartitionRef, ...]]


class IncompleteTopics:
    def __init__(self) -> None:
        self._by_name: dict[str, Incomplete] = {}

    def lookup(self, name: str, kind: str) -> Incomplete | None:
        found = self._by_name.get(name)
        return found if found is not None and found.kind == kind else None

    def record(
        self, name: str, failures: Mapping[int, PushFailure], incomplete: Incomplete, what: str
    ) -> tuple[SluiceError, ...]:
        """Settle one call. A broker answered it could not apply the change: remember the topic (a retry
        of the same request pushes it again) and raise BROKER_UPDATE_FAILED. Otherwise forget it, and
        return the brokers that did not answer (BROKER_NOT_AVAILABLE each) for the answer's
        ``unacknowledged`` list: a degraded success, answered as before this existed (the call succeeded,
        so a repeated create is TOPIC_ALREADY_EXISTS), that their heartbeats complete."""
        if any(f.answered for f in failures.values()):
            self._by_name[name] = incomplete
        else:
            self._by_name.pop(name, None)
        return settle(failures, what)

    def forget(self, name: str) -> None:
        self._by_name.pop(name, None)

    def __len__(self) -> int:
        return len(self._by_name)


def settle(failures: Mapping[int, PushFailure], what: str) -> tuple[SluiceError, ...]:
    """BROKER_UPDATE_FAILED when a broker answered it could not apply the change; else the brokers that
    did not answer (BROKER_NOT_AVAILABLE each), a degraded success their heartbeats complete."""
    if any(f.answered for f in failures.values()):
        raise failed(what, failures)
    return tuple(
        BrokerNotAvailable(f"{what}: broker {b} did not acknowledge ({f.reason}); its heartbeats apply it")
        for b, f in sorted(failures.items())
    )


def failed(what: str, failures: Mapping[int, PushFailure]) -> BrokerUpdateFailed:
    reasons = "; ".join(f"broker {b}: {f.reason}" for b, f in sorted(failures.items()))
    return BrokerUpdateFailed(
        f"{what}: recorded, but {len(failures)} broker(s) did not apply it ({reasons}). The brokers keep "
        "retrying on their heartbeats; fix the cause and retry the same request, which completes it"
    )


async def wait_for_brokers(
    futures: Mapping[int, asyncio.Future[PushOutcome]], timeout_s: float, affected: Iterable[int] = ()
) -> dict[int, PushFailure]:
    """Wait (at most ``timeout_s``) for the pushes; returns broker -> why it did not acknowledge.
    A broker among ``affected`` that got no push (not alive when the change was queued) has not applied it
    either."""
    dead = PushFailure("not alive: no heartbeat within its session timeout")
    failures = {b: dead for b in affected if b not in futures}
    if futures:
        await asyncio.wait(futures.values(), timeout=timeout_s)
    for broker_id, fut in futures.items():
        if not fut.done():
            failures[broker_id] = PushFailure(f"no answer within {timeout_s:g}s")
        elif (outcome := fut.result()) is not None:
            failures[broker_id] = outcome
    return failures
