"""Rebalance latency: 10 members over 100 partitions, then one more joins. How long until the group is
stable again, in heartbeat intervals?

Stable = the coordinator reports the group ``stable`` (every member at the target epoch, nothing pending
revocation) **and** every simulated member holds exactly the partitions it was last assigned. Members
behave as the SDK consumer does (docs/groups.md, docs/consumer.md): each has its own
``ConsumerGroupStream`` (``--unary``: one ``Heartbeat`` RPC per heartbeat, as before the stream), heartbeats
every ``heartbeat_interval_ms`` of the last answer, adopts each assignment, releases revoked partitions at
once and heartbeats right after releasing (committing is not simulated), and heartbeats at once when the
coordinator sends ``heartbeat_now`` (after the answer of a heartbeat in flight). Their phases are spread
over one interval, as independent consumers' would be. Repeated ``--trials`` times on fresh groups;
reports each trial and the median and worst.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

from _stack import read_group_stream, save, stack

TOPIC = "bench-rebalance"


@dataclass
class Member:
    group: str
    member_id: str = ""
    epoch: int = 0
    owned: frozenset[int] = frozenset()
    interval_s: float = 3.0
    #: Slept once before the next heartbeat: spreads the members' phases over the interval.
    shift_s: float = 0.0
    #: Set by ``heartbeat_now`` (stream members): the wait for the next heartbeat ends early.
    wake: asyncio.Event | None = None
    call: Any = None
    answer: asyncio.Future[Any] | None = None
    nudges: int = 0


class Group:
    def __init__(self, stub: Any, pb: Any, common: Any, name: str, unary: bool) -> None:
        self.stub, self.pb, self.common, self.name = stub, pb, common, name
        self.unary = unary
        self.members: list[Member] = []
        self.running = True
        #: Set after every heartbeat answer: the group's state changes only through heartbeats, so the
        #: waiter looks at it exactly when it may have changed.
        self.answered = asyncio.Event()

    async def send(self, m: Member, request: Any) -> Any:
        if self.unary:
            return await self.stub.Heartbeat(request, timeout=10)
        if m.call is None:
            m.call = self.stub.ConsumerGroupStream()
            asyncio.get_running_loop().create_task(read_group_stream(m, m.call))
        m.answer = asyncio.get_running_loop().create_future()
        assert m.wake is not None
        m.wake.clear()  # this heartbeat carries the latest state; a push from now on asks for another
        await m.call.write(self.pb.GroupStreamRequest(heartbeat=request))
        return await asyncio.wait_for(m.answer, 10)

    async def heartbeat(self, m: Member) -> None:
        request = self.pb.GroupHeartbeatRequest(
            group=self.name,
            member_id=m.member_id,
            member_epoch=m.epoch,
            subscription={TOPIC: "*"},
            owned=[self.common.TopicPartition(topic=TOPIC, partition=p) for p in sorted(m.owned)],
        )
        response = await self.send(m, request)
        if response.HasField("error") and response.error.code != 0:
            raise RuntimeError(f"member {m.member_id}: {response.error.message}")
        m.member_id, m.epoch = response.member_id, response.member_epoch
        m.interval_s = response.heartbeat_interval_ms / 1000
        self.answered.set()
        if response.HasField("assignment"):
            new = frozenset(a.partition for a in response.assignment.partitions)
            released = bool(m.owned - new)
            m.owned = new
            if released:
                await self.heartbeat(m)  # tell the coordinator at once (SDK rule 3)

    async def pause(self, m: Member, seconds: float) -> None:
        """Sleep until the next heartbeat is due, or until the coordinator asks for one."""
        assert m.wake is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(m.wake.wait(), seconds)

    async def run(self, m: Member, phase_s: float) -> None:
        m.wake = asyncio.Event()
        try:
            await self.heartbeat(m)
            await self.pause(m, phase_s)
            while self.running:
                await self.heartbeat(m)
                await self.pause(m, m.interval_s + m.shift_s)
                m.shift_s = 0.0
        finally:
            if m.call is not None:
                m.call.cancel()

    async def wait_stable(self, joiner: Member | None = None) -> None:
        await self.answered.wait()  # the group exists once someone joined
        while True:
            self.answered.clear()
            if await self.state() == "stable" and (joiner is None or joiner.owned):
                return
            await self.answered.wait()

    async def state(self) -> str:
        response = await self.stub.DescribeGroup(self.pb.DescribeGroupRequest(group=self.name), timeout=10)
        held = {m.member_id: m.owned for m in self.members}
        for d in response.members:
            assigned = frozenset(a.partition for a in d.assigned)
            if d.pending_revocation or held.get(d.member_id) != assigned:
                return "converging"
        return str(response.state)


async def trial(address: str, n: int, index: int, unary: bool) -> dict[str, float]:
    from grpc import aio

    from sluice.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

    async with aio.insecure_channel(address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        group = Group(stub, coordinator_pb2, common_pb2, f"rebalance-{index}", unary)
        tasks = []
        for _ in range(n):
            m = Member(group.name)
            group.members.append(m)
            tasks.append(asyncio.create_task(group.run(m, random.uniform(0, 3.0))))
        await group.wait_stable()
        interval = max(m.interval_s for m in group.members)
        # While the group formed, everyone heartbeated at the short reconcile interval, so their phases
        # bunched up: spread them over the interval, as independent consumers' are.
        for m in group.members:
            m.shift_s = random.uniform(0, interval)
        await asyncio.sleep(3 * interval + random.uniform(0, interval))  # the join lands at a random phase
        joiner = Member(group.name)
        group.members.append(joiner)
        started = time.perf_counter()
        tasks.append(asyncio.create_task(group.run(joiner, 0)))
        await group.wait_stable(joiner)
        took = time.perf_counter() - started
        group.running = False
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        nudges = sum(m.nudges for m in group.members)
        return {
            "seconds": round(took, 3),
            "intervals": round(took / interval, 3),
            "heartbeat_now_pushes": nudges,
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--unary", action="store_true", help="one Heartbeat RPC per heartbeat, no stream")
    parser.add_argument("--name", default="rebalance", help="results file name")
    args = parser.parse_args()
    with stack() as s:
        from sluice import Client

        with Client(s.bootstrap) as client:
            client.admin.create_topic(TOPIC, partitions=args.partitions)
        results = [asyncio.run(trial(s.bootstrap, args.members, i, args.unary)) for i in range(args.trials)]
    intervals = [r["intervals"] for r in results]
    save(
        args.name,
        {
            "transport": "unary" if args.unary else "stream",
            "members_before_join": args.members,
            "partitions": args.partitions,
            "heartbeat_interval_s": 3.0,
            "trials": results,
            "median_intervals": round(statistics.median(intervals), 3),
            "worst_intervals": max(intervals),
        },
    )


if __name__ == "__main__":
    main()
