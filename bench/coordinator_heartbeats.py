"""Coordinator capacity: group heartbeats per second with thousands of simulated members.

One stack (private Redis, coordinator, one broker). A topic with ``--members`` partitions, so every
member ends up owning one. ``--client-processes`` separate client processes (grpc.aio, ``--channels``
channels each) simulate the members, split between them; each member has its **own**
``ConsumerGroupStream``, as an SDK consumer does (docs/consumer.md). Then:

1. every member **joins** (``--join-concurrency`` joins in flight per process) and keeps heartbeating at
   the interval the coordinator asks for, at once when the coordinator sends ``heartbeat_now``, and right
   after releasing a revoked partition, until the group is ``stable`` (every member holds its target):
   the join time and the time to stable;
2. drives **steady-state heartbeats** open loop at each ``--rates`` value (heartbeat *i* of a process is
   due at ``start + i / (rate / processes)``, round-robin over its members, so each member heartbeats
   every ``members / rate`` seconds), for ``--duration`` seconds after a warm-up, and reports the rate
   achieved, latency p50/p99/max (send to answer) and the latency counted from when each heartbeat was
   *due* (includes the client's own queueing: what coordinated omission would hide). A member still
   waiting for its previous answer when its next heartbeat is due skips it (counted): a member has one
   heartbeat in flight at a time.

It also reports the coordinator's CPU use, each client process's CPU use (so one can tell whether the
clients were the bottleneck), and the Redis commands sent during the steady phase (steady heartbeats must
write nothing). The machine's cores are shared by the coordinator, Redis and the client processes.

``--profile DIR`` runs ``py-spy record`` on the coordinator during the first steady rate
(``.venv/bin/pip install py-spy``) and writes the collapsed stacks there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from array import array
from dataclasses import dataclass
from typing import Any

from _stack import cpu_seconds, read_group_stream, save, stack

GROUP = "bench-hb"
TOPIC = "bench-hb"


# ---- the client processes ------------------------------------------------------------------------------


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
    call: Any = None
    #: The answer awaited for the heartbeat in flight (None: none in flight).
    answer: asyncio.Future[Any] | None = None
    wake: asyncio.Event | None = None
    nudges: int = 0
    #: A steady-phase heartbeat of this member is scheduled or in flight.
    busy: bool = False
    sent: int = 0


def _percentile(values: array[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Driver:
    def __init__(self, address: str, indexes: range, channels: int) -> None:
        from grpc import aio

        from sluice.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

        self.pb = coordinator_pb2
        self.common = common_pb2
        opts = (("grpc.enable_retries", 0),)
        self.channels = [aio.insecure_channel(address, options=opts) for _ in range(channels)]
        self.stubs = [coordinator_pb2_grpc.CoordinatorStub(c) for c in self.channels]
        self.members = [Member(i) for i in indexes]
        self.converging = True
        self.extra_heartbeats = 0

    def build(self, m: Member) -> None:
        m.request = self.pb.GroupStreamRequest(
            heartbeat=self.pb.GroupHeartbeatRequest(
                group=GROUP,
                member_id=m.member_id,
                member_epoch=m.epoch,
                subscription={TOPIC: "*"},
                owned=[self.common.TopicPartition(topic=TOPIC, partition=p) for p in sorted(m.owned)],
            )
        )

    def open(self, m: Member) -> None:
        m.call = self.stubs[m.index % len(self.stubs)].ConsumerGroupStream(None)
        m.wake = m.wake or asyncio.Event()
        asyncio.get_running_loop().create_task(read_group_stream(m, m.call))

    async def send(self, m: Member) -> Any:
        """One heartbeat on the member's stream; its answer."""
        if m.call is None or m.call.done():
            self.open(m)
        assert m.wake is not None
        m.wake.clear()  # this heartbeat carries the latest state; a push from now on asks for another
        m.answer = asyncio.get_running_loop().create_future()
        m.sent += 1
        try:
            await m.call.write(m.request)
            # No per-heartbeat timer (it would cost the client more than the heartbeat): the reader fails
            # this future when the stream ends, and the phase itself is bounded.
            return await m.answer
        except Exception:
            m.call.cancel()
            m.call = None
            raise
        finally:
            m.answer = None

    def absorb(self, m: Member, response: Any) -> bool:
        """What an SDK consumer does with an answer: take the epoch, adopt the assignment (releasing
        anything no longer listed at once: nothing to commit here). True if the member released
        something (it must tell the coordinator at once)."""
        if response.HasField("error") and response.error.code != 0:
            m.errors += 1
            m.member_id, m.epoch, m.owned = "", 0, frozenset()  # fenced/unknown: join again
            self.build(m)
            return False
        changed = response.member_epoch != m.epoch or response.member_id != m.member_id
        m.member_id, m.epoch = response.member_id, response.member_epoch
        released = False
        if response.HasField("assignment"):
            owned = frozenset(a.partition for a in response.assignment.partitions)
            released = bool(m.owned - owned)
            changed = changed or owned != m.owned
            m.owned = owned
        if response.heartbeat_interval_ms > 0:
            m.interval_s = response.heartbeat_interval_ms / 1000
        if changed:
            self.build(m)
        return released

    async def heartbeat(self, m: Member) -> None:
        while True:
            try:
                response = await self.send(m)
            except Exception:  # counted; the member tries again on a new stream
                m.errors += 1
                return
            if not self.absorb(m, response):
                return
            # Released something: tell the coordinator at once (docs/groups.md, SDK rule 3).

    async def member_loop(self, m: Member, gate: asyncio.Semaphore) -> None:
        self.build(m)
        async with gate:
            await self.heartbeat(m)
            m.joined_at = time.perf_counter()
        while self.converging:
            assert m.wake is not None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(m.wake.wait(), m.interval_s)
            if self.converging:
                await self.heartbeat(m)

    async def group_state(self) -> tuple[str, int]:
        response = await self.stubs[0].ListGroups(self.pb.ListGroupsRequest(), timeout=30)
        for g in response.groups:
            if g.group == GROUP:
                return g.state, g.members
        return "absent", 0

    async def join_all(self, concurrency: int, total: int) -> dict[str, float]:
        gate = asyncio.Semaphore(concurrency)
        started = time.perf_counter()
        loops = [asyncio.create_task(self.member_loop(m, gate)) for m in self.members]
        while True:
            await asyncio.sleep(0.1)
            state, count = await self.group_state()
            everyone_holds = all(len(m.owned) == 1 for m in self.members)
            if state == "stable" and count == total and everyone_holds:
                break
        stable = time.perf_counter() - started
        joined = max(m.joined_at for m in self.members) - started
        self.converging = False
        for m in self.members:
            assert m.wake is not None
            m.wake.set()
        await asyncio.gather(*loops, return_exceptions=True)
        return {
            "join_s": round(joined, 2),
            "join_to_stable_s": round(stable, 2),
            "errors": sum(m.errors for m in self.members),
            "heartbeat_now_pushes": sum(m.nudges for m in self.members),
            "heartbeats": sum(m.sent for m in self.members),
        }

    async def steady(self, rate: float, duration: float, warmup: float) -> dict[str, Any]:
        members = self.members
        n = len(members)
        rpc = array("d")
        from_due = array("d")
        errors = changes = skipped = 0
        error_samples: list[str] = []
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.05
        measure_from = start + warmup
        end = measure_from + duration
        sent = 0
        completed_in_window = 0
        nudges_before = sum(m.nudges for m in members)

        async def one(m: Member, due: float) -> None:
            nonlocal errors, changes, completed_in_window
            t0 = time.perf_counter()
            try:
                response = await self.send(m)
            except Exception as exc:
                errors += 1
                if len(error_samples) < 3:
                    error_samples.append(repr(exc)[:300])
                return
            finally:
                m.busy = False
            t1 = time.perf_counter()
            if (
                response.HasField("assignment")
                or response.member_epoch != m.epoch
                or (response.HasField("error") and response.error.code != 0)
            ):
                changes += 1
                self.absorb(m, response)
            if measure_from <= due < end:
                if t1 - t0 > 0.05:
                    bucket = int(time.time() * 10)
                    slow_at[bucket] = slow_at.get(bucket, 0) + 1
                rpc.append(t1 - t0)
                from_due.append(loop.time() - due)
                wall = time.time()
                spans.append(int((wall - (t1 - t0)) * 10))
                spans.append(int(wall * 10))
                completed_in_window += 1

        lags = array("d")
        # 100 ms wall-clock windows in which this client's own event loop stalled (> 20 ms late), and
        # each answer's (sent, answered) windows: answers overlapping a client stall can be told apart.
        stalled: set[int] = set()
        spans = array("q")
        slow_at: dict[int, int] = {}  # wall-clock 100 ms bucket -> answers slower than 50 ms in it

        async def probe() -> None:
            # This process's own event-loop lag: a late wake-up here delays answers it measures, so
            # the clients' share of a latency figure can be told from the coordinator's.
            while loop.time() < end:
                t = loop.time()
                await asyncio.sleep(0.005)
                if loop.time() >= measure_from:
                    lag = loop.time() - t - 0.005
                    lags.append(lag)
                    if lag > 0.02:
                        stalled.add(int(time.time() * 10))

        prober = loop.create_task(probe())
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
                if m.busy:
                    skipped += 1  # its previous heartbeat is still unanswered: one in flight per member
                    continue
                m.busy = True
                task = loop.create_task(one(m, due))
                tasks.add(task)  # a task nobody references may be collected mid-call (CANCELLED)
                task.add_done_callback(tasks.discard)
            await asyncio.sleep(0.002)
        if tasks:
            await asyncio.wait(tasks, timeout=60)
        await prober
        return {
            "loop_lag_p99_ms": round(_percentile(lags, 0.99) * 1000, 2),
            "loop_lag_max_ms": round(max(lags, default=float("nan")) * 1000, 2),
            "slow_at": slow_at,
            "stalled": stalled,
            "spans": spans,
            "completed_in_window": completed_in_window,
            "skipped_in_flight": skipped,
            "errors": errors,
            "error_samples": error_samples,
            "state_changes": changes,
            "heartbeat_now_pushes": sum(m.nudges for m in members) - nudges_before,
            "rpc": rpc,
            "from_due": from_due,
        }

    async def close(self) -> None:
        for m in self.members:
            if m.call is not None:
                m.call.cancel()
        for c in self.channels:
            await c.close(None)


def client_main(
    address: str,
    indexes: range,
    total: int,
    channels: int,
    join_concurrency: int,
    rates: list[float],
    duration: float,
    warmup: float,
    commands: Any,
    results: Any,
) -> None:
    async def run() -> None:
        driver = Driver(address, indexes, channels)
        try:
            results.put(("join", await driver.join_all(join_concurrency, total)))
            # The members' state is long-lived: keep the client's collector off it, so the client's own
            # GC pauses do not show up as coordinator latency.
            gc.collect()
            gc.freeze()
            for rate in rates:
                results.put(("ready", rate))
                commands.get()  # the parent samples CPU and Redis counters, maybe starts the profiler
                results.put(("steady", await driver.steady(rate, duration, warmup)))
        finally:
            await driver.close()

    asyncio.run(run())


# ---- the parent: stack, counters, profiler -------------------------------------------------------------


def redis_commands(url: str) -> int:
    import redis

    with redis.Redis.from_url(url) as r:
        return int(r.info("stats")["total_commands_processed"])


def merge_steady(parts: list[dict[str, Any]], rate: float, duration: float) -> dict[str, Any]:
    rpc: array[float] = array("d")
    from_due: array[float] = array("d")
    for p in parts:
        rpc.extend(p["rpc"])
        from_due.extend(p["from_due"])
    return {
        "target_rate": rate,
        "achieved_rate": round(sum(p["completed_in_window"] for p in parts) / duration),
        "skipped_in_flight": sum(p["skipped_in_flight"] for p in parts),
        "errors": sum(p["errors"] for p in parts),
        "error_samples": [s for p in parts for s in p["error_samples"]][:3],
        "state_changes": sum(p["state_changes"] for p in parts),
        "heartbeat_now_pushes": sum(p["heartbeat_now_pushes"] for p in parts),
        "client_loop_lag_p99_ms": [p["loop_lag_p99_ms"] for p in parts],
        "client_loop_lag_max_ms": [p["loop_lag_max_ms"] for p in parts],
        # 100 ms windows with answers slower than 50 ms, and in how many client processes: a stall of
        # the coordinator shows in every process at once, a client's own stall in one.
        "slow_windows": _slow_windows(parts),
        "client_stall_windows": len(set().union(*(p["stalled"] for p in parts))),
        # Diagnostic, not the figure: the p99 of answers during which no client process stalled. When
        # the machine is overloaded (other work on the shared cores), every process stalls at once and
        # the plain p99 measures that; this one shows what is left when the clients ran freely.
        "rpc_p99_ms_outside_client_stalls": round(_p99_outside_stalls(parts) * 1000, 2),
        "rpc_p50_ms": round(_percentile(rpc, 0.50) * 1000, 2),
        "rpc_p99_ms": round(_percentile(rpc, 0.99) * 1000, 2),
        "rpc_max_ms": round(max(rpc, default=float("nan")) * 1000, 2),
        "from_due_p50_ms": round(_percentile(from_due, 0.50) * 1000, 2),
        "from_due_p99_ms": round(_percentile(from_due, 0.99) * 1000, 2),
    }


def _p99_outside_stalls(parts: list[dict[str, Any]]) -> float:
    stalled: set[int] = set().union(*(p["stalled"] for p in parts))
    kept: array[float] = array("d")
    for p in parts:
        spans = p["spans"]
        for i, latency in enumerate(p["rpc"]):
            first, last = spans[2 * i], spans[2 * i + 1]
            if not any(b in stalled for b in range(first, last + 1)):
                kept.append(latency)
    return _percentile(kept, 0.99)


def _slow_windows(parts: list[dict[str, Any]]) -> dict[str, int]:
    seen: dict[int, int] = {}
    for p in parts:
        for bucket in p["slow_at"]:
            seen[bucket] = seen.get(bucket, 0) + 1
    return {
        "total": len(seen),
        "in_every_process": sum(1 for c in seen.values() if c == len(parts)),
        "in_one_process": sum(1 for c in seen.values() if c == 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--members", type=int, default=5000)
    parser.add_argument("--rates", type=float, nargs="+", default=[5000.0])
    parser.add_argument("--duration", type=float, default=15.0, help="measured seconds per rate")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--client-processes", type=int, default=3)
    parser.add_argument("--channels", type=int, default=8, help="channels per client process")
    parser.add_argument("--join-concurrency", type=int, default=200, help="joins in flight per process")
    parser.add_argument("--profile", default="", help="directory for a py-spy profile of the coordinator")
    parser.add_argument("--name", default="coordinator_heartbeats", help="results file name")
    args = parser.parse_args()
    procs_n = args.client_processes

    with stack() as s:
        from sluice import Client

        with Client(s.bootstrap) as client:
            client.admin.create_topic(TOPIC, partitions=args.members)
        coordinator_pid = s.coordinator.process.pid
        redis_url = _redis_url_of(s)
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        commands = [ctx.Queue() for _ in range(procs_n)]
        procs = [
            ctx.Process(
                target=client_main,
                args=(
                    s.bootstrap,
                    range(k, args.members, procs_n),
                    args.members,
                    args.channels,
                    args.join_concurrency,
                    [r / procs_n for r in args.rates],
                    args.duration,
                    args.warmup,
                    commands[k],
                    results,
                ),
            )
            for k in range(procs_n)
        ]
        cpu0 = cpu_seconds(coordinator_pid)
        for p in procs:
            p.start()
        joins = [_expect(results, "join", 1800) for _ in procs]
        join = {
            "join_s": max(j["join_s"] for j in joins),
            "join_to_stable_s": max(j["join_to_stable_s"] for j in joins),
            "errors": sum(j["errors"] for j in joins),
            "heartbeat_now_pushes": sum(j["heartbeat_now_pushes"] for j in joins),
            "heartbeats": sum(j["heartbeats"] for j in joins),
            "coordinator_cpu_s": round(cpu_seconds(coordinator_pid) - cpu0, 1),
        }
        print("join:", join, flush=True)
        steady: list[dict[str, Any]] = []
        for rate in args.rates:
            for _ in procs:
                _expect(results, "ready", 600)
            spy = None
            if args.profile and not steady:
                spy = _start_profiler(coordinator_pid, args.profile, args.warmup + args.duration)
            pids = [p.pid for p in procs if p.pid is not None]
            cpu0, cmd0, t0 = cpu_seconds(coordinator_pid), redis_commands(redis_url), time.perf_counter()
            clients0 = [cpu_seconds(pid) for pid in pids]
            load0 = os.getloadavg()[0]
            for q in commands:
                q.put("go")
            parts = [_expect(results, "steady", 600) for _ in procs]
            elapsed = time.perf_counter() - t0
            figures = merge_steady(parts, rate, args.duration)
            figures["coordinator_cpu_pct"] = round(100 * (cpu_seconds(coordinator_pid) - cpu0) / elapsed)
            figures["client_cpu_pct"] = [
                round(100 * (cpu_seconds(pid) - c0) / elapsed) for pid, c0 in zip(pids, clients0, strict=True)
            ]
            # The machine is shared: other work's load is part of every figure.
            figures["load_average_1m"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
            figures["cpu_pressure_avg10"] = _cpu_pressure()
            # The lag refresh reads committed offsets every 10 s; heartbeats themselves must add nothing.
            figures["redis_commands_during_phase"] = redis_commands(redis_url) - cmd0 - 1
            if spy is not None:
                spy.wait(timeout=120)
            print("steady:", figures, flush=True)
            steady.append(figures)
        for p in procs:
            p.join(timeout=60)
        if os.environ.get("BENCH_SHOW_LOG"):  # e.g. with PYTHONASYNCIODEBUG=1: the slow callbacks
            print("".join(s.coordinator.output[-60:]))
    save(
        args.name,
        {
            "members": args.members,
            "partitions": args.members,
            "transport": "one ConsumerGroupStream per member",
            "client_processes": procs_n,
            "channels_per_process": args.channels,
            "load_average_at_end": os.getloadavg(),
            "join": join,
            "steady": steady,
        },
    )


_early: dict[str, list[Any]] = {}


def _expect(results: Any, kind: str, timeout: float) -> Any:
    """The next message of ``kind`` from any client process (others' messages of other kinds wait)."""
    while not _early.get(kind):
        got, value = results.get(timeout=timeout)
        _early.setdefault(got, []).append(value)
    return _early[kind].pop(0)


def _cpu_pressure() -> float | None:
    """Share of the last 10 s in which some runnable task waited for a CPU (Linux PSI), in percent."""
    try:
        with open("/proc/pressure/cpu") as f:
            return float(f.readline().split()[1].split("=")[1])
    except (OSError, IndexError, ValueError):
        return None


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
