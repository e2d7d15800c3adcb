"""``sticky`` (the default): balanced, and moving as few partitions as balance allows.

It starts from the group's current target assignment and changes it in three steps:

1. **Keep.** Every member keeps each partition it owns that still exists and that it still
   subscribes to. (A partition two members claim, which the coordinator never produces, stays with
   the first by member id.)
2. **Place.** Partitions with no owner left (new partitions, and those of members that left or
   unsubscribed) go one at a time to the least-loaded member that subscribes to the topic, ties to
   the smaller member id. Topics with the fewest subscribers are placed first, since they have the
   fewest choices.
3. **Balance.** While some member owns a partition that a subscriber with at least two fewer
   partitions could take, the most-loaded member hands one to the least-loaded such subscriber,
   preferring a partition it only got in step 2, so no owned partition moves twice.

What that guarantees:

* Every partition of a subscribed topic has exactly one owner, and only a subscriber.
* No move is possible that would cut a gap of two or more. So members with identical subscriptions
  end within one partition of each other; with differing subscriptions, a member can only be two or
  more ahead of another that cannot take any of its partitions.
* When every member subscribes to the same topics, the number of partitions that change owner is the
  minimum any balanced assignment needs: with ``q = total // members`` and ``r = total % members``,
  the ``r`` members already holding the most keep ``q + 1``, the others keep ``q``, and only the
  excess moves. A joining member takes exactly the excess from the most loaded; a leaving member's
  partitions are spread over the least loaded and nothing else moves.

Worked example: ``c0``, ``c1``, ``c2`` own 12 partitions of ``orders``, four each. ``c3`` joins:
each old member gives up one partition (three moves, the minimum for 3/3/3/3) and keeps the rest.
Then ``c0`` leaves: its three partitions go to the three least-loaded members; nothing else moves.

>>> from sluice.coordinator.assignors.api import GroupSpec, MemberSpec, format_assignment
>>> def spec(*ids: str) -> dict[str, MemberSpec]:
...     return {m: MemberSpec(m, None, frozenset({"orders"})) for m in ids}
>>> current = {f"c{m}": frozenset(("orders", 4 * m + i) for i in range(4)) for m in range(3)}
>>> joined = StickyAssignor().assign(GroupSpec(spec("c0", "c1", "c2", "c3"), current), {"orders": 12})
>>> for member_id, partitions in format_assignment(joined).items():
...     print(member_id, partitions)
c0 ['orders-0', 'orders-1', 'orders-2']
c1 ['orders-4', 'orders-5', 'orders-6']
c2 ['orders-8', 'orders-9', 'orders-10']
c3 ['orders-3', 'orders-7', 'orders-11']
>>> left = StickyAssignor().assign(GroupSpec(spec("c1", "c2", "c3"), joined), {"orders": 12})
>>> for member_id, partitions in format_assignment(left).items():
...     print(member_id, partitions)
c1 ['orders-0', 'orders-4', 'orders-5', 'orders-6']
c2 ['orders-1', 'orders-8', 'orders-9', 'orders-10']
c3 ['orders-2', 'orders-3', 'orders-7', 'orders-11']
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass

from sluice.coordinator.assignors.api import (
    Assignment,
    GroupSpec,
    TopicPartition,
    check_inputs,
    subscribers_by_topic,
)

__all__ = ["StickyAssignor"]


class _Pool:
    """A set of members, with a lazy min-heap of (count, member_id), that can take ``topics``.

    "Who is the least-loaded subscriber of topic t?" is asked for every placed partition and every
    balancing step, so it must be a heap peek, not a scan. A pool is either one subscription class
    (members with identical subscriptions; a topic asks every class that includes it) or one topic
    (its subscribers; a member's count change updates every topic it reads). ``_Balancer`` picks
    whichever layout is cheaper for the group. A heap entry is live only while its count equals the
    member's current count; stale ones are dropped when they surface.
    """

    __slots__ = ("heap", "topics")

    def __init__(self, topics: frozenset[str]) -> None:
        self.topics = topics
        self.heap: list[tuple[int, str]] = []

    def least_loaded(self, counts: Mapping[str, int]) -> tuple[int, str]:
        heap = self.heap
        while heap[0][0] != counts[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0]


class _Balancer:
    """The working state of one assignment; ``run`` performs the three steps."""

    def __init__(self, group: GroupSpec, topic_partitions: Mapping[str, int]) -> None:
        self.group = group
        self.topic_partitions = topic_partitions
        self.subscribers = subscribers_by_topic(group, topic_partitions)
        self.members = sorted(group.members)
        self.owned: dict[str, dict[str, set[int]]] = {m: {} for m in self.members}
        self.kept: dict[str, frozenset[TopicPartition]] = {}
        self.counts: dict[str, int] = dict.fromkeys(self.members, 0)
        self.claimed: set[TopicPartition] = set()
        self.topics_of = {
            m: frozenset(t for t in group.members[m].topics if t in self.subscribers) for m in self.members
        }
        self.pools_of_member: dict[str, list[_Pool]] = {}
        self.pools_of_topic: dict[str, list[_Pool]] = {}
        self._build_pools()

    def _build_pools(self) -> None:
        classes: dict[frozenset[str], _Pool] = {}
        for member_id in self.members:
            topics = self.topics_of[member_id]
            self.pools_of_member[member_id] = [classes.setdefault(topics, _Pool(topics))]
        by_class = {t: [c for c in classes.values() if t in c.topics] for t in self.subscribers}
        # Class pools cost a peek per class per query; topic pools cost a push per subscribed topic
        # per count change. With few distinct subscriptions (the usual case) classes win; with many
        # (say 5,000 members each reading a different 3 of 10 topics) topic pools do.
        query_cost = sum(len(c) for c in by_class.values()) / max(len(by_class), 1)
        update_cost = sum(len(t) for t in self.topics_of.values()) / max(len(self.members), 1)
        if query_cost <= max(update_cost, 2):
            self.pools_of_topic = by_class
            return
        topic_pools = {t: _Pool(frozenset((t,))) for t in self.subscribers}
        self.pools_of_topic = {t: [pool] for t, pool in topic_pools.items()}
        for member_id in self.members:
            self.pools_of_member[member_id] = [topic_pools[t] for t in sorted(self.topics_of[member_id])]

    def run(self) -> Assignment:
        self._keep()
        pools: dict[int, _Pool] = {}
        for member_id in self.members:
            for pool in self.pools_of_member[member_id]:
                pool.heap.append((self.counts[member_id], member_id))
                pools[id(pool)] = pool
        for pool in pools.values():
            heapq.heapify(pool.heap)
        self._place()
        while self._balance_pass():
            pass
        return {
            member_id: frozenset((t, i) for t, indexes in self.owned[member_id].items() for i in indexes)
            for member_id in self.members
        }

    def _keep(self) -> None:
        claimed = self.claimed
        current = self.group.current
        for member_id in self.members:
            topics = self.topics_of[member_id]
            kept = []
            for tp in sorted(current.get(member_id, ())):
                topic, index = tp
                if topic in topics and 0 <= index < self.topic_partitions[topic] and tp not in claimed:
                    claimed.add(tp)
                    kept.append(tp)
                    self.owned[member_id].setdefault(topic, set()).add(index)
            self.kept[member_id] = frozenset(kept)
            self.counts[member_id] = len(kept)

    def _place(self) -> None:
        counts = self.counts
        by_choice = sorted(self.subscribers, key=lambda t: (len(self.subscribers[t]), t))
        for topic in by_choice:
            pools = self.pools_of_topic[topic]
            for index in range(self.topic_partitions[topic]):
                if (topic, index) in self.claimed:
                    continue
                _, member_id = min(pool.least_loaded(counts) for pool in pools)
                self._give(member_id, topic, index)

    def _give(self, member_id: str, topic: str, index: int) -> None:
        self.owned[member_id].setdefault(topic, set()).add(index)
        self.counts[member_id] += 1
        self._requeue(member_id)

    def _requeue(self, member_id: str) -> None:
        entry = (self.counts[member_id], member_id)
        for pool in self.pools_of_member[member_id]:
            heapq.heappush(pool.heap, entry)

    def _balance_pass(self) -> bool:
        """Offer every member, most loaded first, the chance to hand one partition to a subscriber at
        least two behind it. Returns whether anything moved (then the caller runs another pass, since
        a member that gave something away may now be a taker for one already offered)."""
        counts = self.counts
        moved = False
        most_loaded = [(-counts[m], m) for m in self.members if counts[m] > 0]
        heapq.heapify(most_loaded)
        while most_loaded:
            negative, donor = heapq.heappop(most_loaded)
            if -negative != counts[donor]:
                continue  # stale entry
            move = self._best_move(donor)
            if move is None:
                continue
            taker, topic, index = move
            self.owned[donor][topic].discard(index)
            if not self.owned[donor][topic]:
                del self.owned[donor][topic]
            counts[donor] -= 1
            self._requeue(donor)
            self._give(taker, topic, index)
            heapq.heappush(most_loaded, (-counts[donor], donor))
            heapq.heappush(most_loaded, (-counts[taker], taker))
            moved = True
        return moved

    def _best_move(self, donor: str) -> tuple[str, str, int] | None:
        counts = self.counts
        owned_topics = self.owned[donor]
        best: tuple[int, str] | None = None
        best_topics: list[str] = []
        seen: set[int] = set()
        for topic in owned_topics:
            for pool in self.pools_of_topic[topic]:
                if id(pool) in seen:
                    continue
                seen.add(id(pool))
                candidate = pool.least_loaded(counts)
                if candidate[0] <= counts[donor] - 2 and (best is None or candidate < best):
                    best = candidate
                    best_topics = [t for t in owned_topics if t in pool.topics]
        if best is None:
            return None
        # Hand over a partition the donor only received in this run if it has one (that is no real
        # movement); otherwise the last one in (topic, index) order, so the choice is reproducible.
        kept = self.kept[donor]
        candidates = [(t, i) for t in best_topics for i in owned_topics[t]]
        fresh = [tp for tp in candidates if tp not in kept]
        topic, index = max(fresh or candidates)
        return best[1], topic, index


@dataclass(frozen=True)
class StickyAssignor:
    """Balanced with minimal movement relative to ``group.current``."""

    name: str = "sticky"

    def assign(self, group: GroupSpec, topic_partitions: Mapping[str, int]) -> Assignment:
        check_inputs(group, topic_partitions)
        return _Balancer(group, topic_partitions).run()
