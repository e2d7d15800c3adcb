"""Coordinator capacity: group heartbeats per second with thousands of simulated members.

One stack (private Redis, coordinator, one broker). A topic with ``--members`` partitions, so every
member ends up owning one. A separate client process (grpc.aio, several channels) then:

1. **joins** every member (``--join-concurrency`` joins in flight) and keeps each one heartbeating at
   the interval the coordinator asks for, releasing revoked partitions at once, until the group is
   ``stable`` (every member holds its target): the join time and the time to stable;
2. drives **steady-state heartbeats** open loop at each ``--rates`` value (heartbeat *i* is due at
   ``start + i / rate``, round-robin over the members), for ``--duration`` seconds after a warm-up,
   and reports the rate achieved, RPC latency p50/p99/max (send to answer) and the latency counted
   from when each heartbeat was *due* (includes the client's own queueing: what coordinated omission
   would hide).

It also reports the coordinator's CPU use and the Redis commands it sent during the steady phase
(steady heartbeats must write nothing). The machine's cores are shared by the coordinator, Redis and
the client process: the figures say what one Python client can drive against one coordinator here.

``--profile DIR`` runs ``py-spy record`` on the coordinator during the first steady rate
(``.venv/bin/pip install py-spy``) and writes a flame graph there.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

from _stack import save, stack

GROUP = "bench-hb"
TOPIC = "bench-hb"


# ---- the client process --------------------------------------------------------------------------------


@dataclass
class Member:
    index: int
    member_id: str = ""
    epoch: int = 0
    owned: frozenset[int] = frozenset()
    interval_s: float = 3.0
    request: Any = None
    joined_at: float = 0.0
    errors: int = 0
    changes: int = 0
    history: list[str] = field(default_factory=list)


def _percentile(values: array, q: float) -> float:  # type: ignore[type-arg]
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Driver:
    def __init__(self, address: str, members: int, channels: int) -> None:
        from grpc import aio

        from sluice.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

        self.pb = coordinator_pb2
        self.common = common_pb2
        opts = (("grpc.enable_retries", 0),)
        self.channels = [aio.insecure_channel(address, options=opts) for _ in range(channels)]
        self.stubs = [coordinator_pb2_grpc.CoordinatorStub(c) for c in self.channels]
        self.members = [Member(i) for i in range(members)]
        self.converging = True

    def build(self, m: Member) -> None:
        m.request = self.pb.GroupHeartbeatRequest(
            group=GROUP,
            member_id=m.member_id,
            member_epoch=m.epoch,
            subscription={TOPIC: "*"},
            owned=[self.common.TopicPartition(topic=TOPIC, partition=p) for p in sorted(m.owned)],
        )

    def absorb(self, m: Member, response: Any) -> None:
        """What an SDK consumer does with an answer: take the epoch, adopt the assignment (releasing
        anything no longer listed at once: nothing to commit here)."""
        if response.HasField("error") and response.error.code != 0:
            m.errors += 1
            m.member_id, m.epoch, m.owned = "", 0, frozenset()  # fenced/unknown: join again
            self.build(m)
            return
        changed = response.member_epoch != m.epoch or response.member_id != m.member_id
        m.member_id, m.epoch = response.member_id, response.member_epoch
        if response.HasField("assignment"):
            owned = frozenset(a.partition for a in response.assignment.partitions)
            changed = changed or owned != m.owned
            m.owned = owned
        if response.heartbeat_interval_ms > 0:
            m.interval_s = response.heartbeat_interval_ms / 1000
        if changed:
            m.changes += 1
            self.build(m)

    async def heartbeat(self, m: Member) -> None:
        stub = self.stubs[m.index % len(self.stubs)]
        try:
            response = await stub.Heartbeat(m.request, timeout=30)
        except Exception:  # counted; the member tries again
            m.errors += 1
            return
        previous = m.owned
        self.absorb(m, response)
        if m.owned < previous:
            # Released something: tell the coordinator at once (docs/groups.md, SDK rule 3).
            await self.heartbeat(m)

    async def member_loop(self, m: Member, gate: asyncio.Semaphore) -> None:
        self.build(m)
        async with gate:
            await self.heartbeat(m)
            m.joined_at = time.perf_counter()
        while self.converging:
            await asyncio.sleep(m.interval_s)
            if self.converging:
                await self.heartbeat(m)

    async def group_state(self) -> tuple[str, int]:
        response = await self.stubs[0].ListGroups(self.pb.ListGroupsRequest(), timeout=30)
        for g in response.groups:
            if g.group == GROUP:
                return g.state, g.members
        return "absent", 0

    async def join_all(self, concurrency: int) -> dict[str, float]:
        gate = asyncio.Semaphore(concurrency)
        started = time.perf_counter()
        loops = [asyncio.create_task(self.member_loop(m, gate)) for m in self.members]
        while True:
            await asyncio.sleep(0.1)
            state, count = await self.group_state()
            everyone_holds = all(len(m.owned) == 1 for m in self.members)
            if state == "stable" and count == len(self.members) and everyone_holds:
                break
        stable = time.perf_counter() - started
        joined = max(m.joined_at for m in self.members) - started
        self.converging = False
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        return {"join_s": round(joined, 2), "join_to_stable_s": round(stable, 2)}

    async def steady(self, rate: float, duration: float, warmup: float, max_in_flight: int) -> dict[str, Any]:
        members = self.members
        n = len(members)
        rpc = array("d")
        from_due = array("d")
        errors = changes = skipped = 0
        error_samples: list[str] = []
        in_flight = 0
        loop = asyncio.get_running_loop()
        done_event = asyncio.Event()
        start = loop.time() + 0.05
        measure_from = start + warmup
        end = measure_from + duration
        sent = 0
        completed_in_window = 0

        async def one(m: Member, due: float) -> None:
            nonlocal in_flight, errors, changes, completed_in_window
            stub = self.stubs[m.index % len(self.stubs)]
            t0 = time.perf_counter()
            try:
                response = await stub.Heartbeat(m.request, timeout=30)
            except Exception as exc:
                errors += 1
                if len(error_samples) < 3:
                    error_samples.append(repr(exc)[:300])
            else:
                t1 = time.perf_counter()
                if (
                    response.HasField("assignment")
                    or response.member_epoch != m.epoch
                    or (response.HasField("error") and response.error.code != 0)
                ):
                    changes += 1
                    self.absorb(m, response)
                now = loop.time()
                if measure_from <= due < end:
                    rpc.append(t1 - t0)
                    from_due.append(now - due)
                    completed_in_window += 1
            in_flight -= 1
            if in_flight == 0 and sent_all:
                done_event.set()

        sent_all = False
        tasks: set[asyncio.Task[None]] = set()
        while True:
            now = loop.time()
            if now >= end:
                break
            due_count = int((now - start) * rate) + 1
            while sent < due_count:
                due = start + sent / rate
                m = members[sent % n]
                sent += 1
                if in_flight >= max_in_flight:
                    skipped += 1  # the coordinator (or the client) cannot keep up: counted, not queued
                    continue
                in_flight += 1
                task = loop.create_task(one(m, due))
                tasks.add(task)  # a task nobody references may be collected mid-call (CANCELLED)
                task.add_done_callback(tasks.discard)
            await asyncio.sleep(0.002)
        sent_all = True
        if in_flight:
            await asyncio.wait_for(done_event.wait(), 60)
        window_sent = int(duration * rate)
        return {
            "target_rate": rate,
            "achieved_rate": round(completed_in_window / duration),
            "sent_in_window": window_sent,
            "skipped_at_in_flight_cap": skipped,
            "errors": errors,
            "error_samples": error_samples,
            "state_changes": changes,
            "rpc_p50_ms": round(_percentile(rpc, 0.50) * 1000, 2),
            "rpc_p99_ms": round(_percentile(rpc, 0.99) * 1000, 2),
            "rpc_max_ms": round(max(rpc, default=float("nan")) * 1000, 2),
            "from_due_p50_ms": round(_percentile(from_due, 0.50) * 1000, 2),
            "from_due_p99_ms": round(_percentile(from_due, 0.99) * 1000, 2),
        }

    async def close(self) -> None:
        for c in self.channels:
            await c.close(None)


def client_main(
    address: str,
    members: int,
    channels: int,
    join_concurrency: int,
    rates: list[float],
    duration: float,
    warmup: float,
    max_in_flight: int,
    commands: Any,
    results: Any,
) -> None:
    async def run() -> None:
        driver = Driver(address, members, channels)
        try:
            results.put(("join", await driver.join_all(join_concurrency)))
            # The members' state is long-lived: keep the client's collector off it, so the client's own
            # GC pauses do not show up as coordinator latency.
            gc.collect()
            gc.freeze()
            for rate in rates:
                results.put(("ready", rate))
                commands.get()  # the parent samples CPU and Redis counters, maybe starts the profiler
                results.put(("steady", await driver.steady(rate, duration, warmup, max_in_flight)))
        finally:
            await driver.close()

    asyncio.run(run())


# ---- the parent: stack, counters, profiler -------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_commands(url: str) -> int:
    import redis

    with redis.Redis.from_url(url) as r:
        return int(r.info("stats")["total_commands_processed"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--members", type=int, default=5000)
    parser.add_argument("--rates", type=float, nargs="+", default=[5000.0])
    parser.add_argument("--duration", type=float, default=15.0, help="measured seconds per rate")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument("--join-concurrency", type=int, default=500)
    parser.add_argument("--max-in-flight", type=int, default=2000)
    parser.add_argument("--profile", default="", help="directory for a py-spy flame graph of the coordinator")
    parser.add_argument("--name", default="coordinator_heartbeats", help="results file name")
    args = parser.parse_args()

    with stack() as s:
        from sluice import Client

        with Client(s.bootstrap) as client:
            client.admin.create_topic(TOPIC, partitions=args.members)
        coordinator_pid = s.coordinator.process.pid
        redis_url = _redis_url_of(s)
        ctx = mp.get_context("spawn")
        commands, results = ctx.Queue(), ctx.Queue()
        proc = ctx.Process(
            target=client_main,
            args=(
                s.bootstrap,
                args.members,
                args.channels,
                args.join_concurrency,
                args.rates,
                args.duration,
                args.warmup,
                args.max_in_flight,
                commands,
                results,
            ),
        )
        cpu0 = cpu_seconds(coordinator_pid)
        proc.start()
        kind, join = results.get(timeout=1800)
        assert kind == "join", kind
        join["coordinator_cpu_s"] = round(cpu_seconds(coordinator_pid) - cpu0, 1)
        print("join:", join, flush=True)
        steady: list[dict[str, Any]] = []
        for _ in args.rates:
            kind, _rate = results.get(timeout=600)
            assert kind == "ready", kind
            spy = None
            if args.profile and not steady:
                spy = _start_profiler(coordinator_pid, args.profile, args.warmup + args.duration)
            cpu0, cmd0, t0 = cpu_seconds(coordinator_pid), redis_commands(redis_url), time.perf_counter()
            commands.put("go")
            kind, figures = results.get(timeout=600)
            elapsed = time.perf_counter() - t0
            figures["coordinator_cpu_pct"] = round(100 * (cpu_seconds(coordinator_pid) - cpu0) / elapsed)
            # The lag refresh reads committed offsets every 10 s; heartbeats themselves must add nothing.
            figures["redis_commands_during_phase"] = redis_commands(redis_url) - cmd0 - 1
            if spy is not None:
                spy.wait(timeout=120)
            print("steady:", figures, flush=True)
            steady.append(figures)
        proc.join(timeout=60)
        if os.environ.get("BENCH_SHOW_LOG"):  # e.g. with PYTHONASYNCIODEBUG=1: the slow callbacks
            print("".join(s.coordinator.output[-60:]))
    save(
        args.name,
        {
            "members": args.members,
            "partitions": args.members,
            "channels": args.channels,
            "client_processes": 1,
            "join": join,
            "steady": steady,
        },
    )


def _redis_url_of(s: Any) -> str:
    args = s.coordinator.args
    return str(args[args.index("--redis-url") + 1])


def _start_profiler(pid: int, directory: str, seconds: float) -> subprocess.Popen[bytes] | None:
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        print("py-spy is not installed: .venv/bin/pip install py-spy")
        return None
    os.makedirs(directory, exist_ok=True)
    # Collapsed stacks (one line per stack, with its sample count): grep-able, and flamegraph.pl input.
    out = os.path.join(directory, f"coordinator-{int(time.time())}.txt")
    print("profiling the coordinator into", out, flush=True)
    command = [spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--format", "raw"]
    return subprocess.Popen(
        [*command, "--output", out, "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )


if __name__ == "__main__":
    main()
