"""Runs each configuration on servers of its own: the throughput repetitions, the latency run at a
fixed rate and the latency-versus-throughput curve, every run checked for completeness."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compare import procs, servers
from compare.adapters.base import Adapter, Endpoint
from compare.systems import SERVERS


@dataclass
class Plan:
    """What every configuration runs. ``records``/``reps``: the concurrent produce+consume runs;
    ``latency_rate`` for ``latency_seconds``: the latency CDF; ``curve_rates`` for ``curve_seconds``
    each: the latency-versus-throughput curve. Every paced run sends ``warmup_seconds`` first, at the
    same rate, delivered and checked but not in the latencies (connections, first fetches)."""

    #: The issue's 1,000,000 per throughput run, each run also capped at ``throughput_seconds`` of sending:
    #: from Python, RabbitMQ's and NATS's clients move 1,000-35,000 records/s, so 1,000,000 x 3
    #: repetitions of them alone took hours on a slower machine. The fast systems send all of it (at
    #: 100,000 a Sluice run lasted 0.3 s, and its start-up, not its rate, set the figure: 358k against
    #: 573-588k records/s at 1,000,000 on the same machine); a capped run is checked on what it sent.
    records: int = 1_000_000
    throughput_seconds: float = 15.0
    reps: int = 3
    latency_rate: int = 2000
    latency_seconds: float = 10.0
    curve_rates: tuple[int, ...] = (1000, 5000, 20000, 50000)
    curve_seconds: float = 5.0
    warmup_seconds: float = 1.0
    quick: bool = False


@dataclass
class SystemResult:
    name: str
    label: str
    durability: str
    sluice: bool
    pair: str
    version: str = ""
    throughput: list[dict[str, Any]] = field(default_factory=list)
    latency: dict[str, Any] = field(default_factory=dict)
    curve: list[dict[str, Any]] = field(default_factory=list)
    peak_rss_mb: float = 0.0
    rss_by_process: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        runs = [*self.throughput, self.latency, *self.curve]
        return bool(self.errors) or any(r.get("status") != "OK" for r in runs)


def run_system(adapter: Adapter, plan: Plan, ports: servers.Ports) -> SystemResult:
    """Start the configuration's servers, run the plan on them, stop them (by PID) whatever happens."""
    result = SystemResult(adapter.name, adapter.label, adapter.durability, adapter.sluice, adapter.pair)
    with servers.workdir() as d:
        try:
            server = SERVERS[adapter.server](ports, Path(d))
        except servers.ServerError as exc:
            result.errors.append(f"server did not start: {exc}")
            return result
        result.version = server.version
        sampler = procs.Sampler(server.pids)
        with servers.running(server), sampler.running():
            _run_plan(adapter, plan, server.endpoint, sampler, result)
        result.peak_rss_mb = round(sampler.peak_mb, 1)
        result.rss_by_process = sampler.by_process()
    return result


def _run_plan(
    adapter: Adapter, plan: Plan, endpoint: Endpoint, sampler: procs.Sampler, result: SystemResult
) -> None:
    stamp = int(time.time() * 1000) % 1_000_000
    for rep in range(plan.reps):
        dest = f"cmp-{stamp}-t{rep}"
        run = run_one(adapter, endpoint, dest, plan.records, 0.0, 0.0, sampler, plan.throughput_seconds)
        result.throughput.append(run)
        print(_line(adapter, f"throughput {rep + 1}/{plan.reps}", run), flush=True)
    paced = [(plan.latency_rate, plan.latency_seconds, "latency")]
    paced += [(rate, plan.curve_seconds, "curve") for rate in plan.curve_rates]
    for i, (rate, seconds, kind) in enumerate(paced):
        n = int(rate * (plan.warmup_seconds + seconds))
        dest = f"cmp-{stamp}-l{i}"
        run = run_one(adapter, endpoint, dest, n, rate, plan.warmup_seconds, sampler)
        run["target_rate"] = rate
        if kind == "latency":
            result.latency = run
        else:
            run.pop("latency_cdf_ms", None)
            result.curve.append(run)
        print(_line(adapter, f"{rate}/s", run), flush=True)


def run_one(
    adapter: Adapter, endpoint: Endpoint, dest: str, n: int, rate: float, warmup_s: float,
    sampler: procs.Sampler, max_seconds: float = 0.0,
) -> dict[str, Any]:  # fmt: skip
    """One producer process and one consumer process at the same time over a fresh destination.
    ``max_seconds``: an unpaced run stops sending after this long (0: never)."""
    try:
        adapter.prepare(endpoint, dest)
    except Exception as exc:
        return {"status": "FAILED", "reason": f"prepare: {exc!r}", "records": n}
    ctx = mp.get_context("spawn")
    ready, done, sent, out = ctx.Event(), ctx.Event(), ctx.Value("q", 0), ctx.Queue()
    cpu_before = sampler.cpu()
    args = (adapter, endpoint, dest, n)
    # A paced run that the system cannot keep up with stops sending at twice its planned length.
    if rate:
        max_seconds = 2 * n / rate
    consumer = ctx.Process(target=procs.consumer_main, args=(*args, rate > 0, ready, done, sent, out))
    producer = ctx.Process(
        target=procs.producer_main, args=(*args, rate, max_seconds, warmup_s, ready, done, sent, out)
    )
    consumer.start()
    producer.start()
    sides: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 180 + n / 500
    with contextlib.suppress(Exception):
        while len(sides) < 2 and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                got = out.get(timeout=1)
                sides[got["side"]] = got
            if len(sides) < 2 and not (consumer.is_alive() or producer.is_alive()) and out.empty():
                break
    for p in (producer, consumer):
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join(5)
    server_cpu = sampler.cpu() - cpu_before
    with contextlib.suppress(Exception):
        adapter.cleanup(endpoint, dest)
    return _summary(n, rate, sides, server_cpu)


def _summary(n: int, rate: float, sides: dict[str, dict[str, Any]], server_cpu: float) -> dict[str, Any]:
    prod, cons = sides.get("producer", {}), sides.get("consumer", {})
    reasons = [f"{side}: {s['error']}" for side, s in sides.items() if "error" in s]
    reasons += [f"no report from the {side}" for side in ("producer", "consumer") if side not in sides]
    for what in ("missing", "duplicates", "unexpected"):
        if cons.get(what):
            reasons.append(
                f"{cons[what]} {what}" + (f" (first: {cons['first_missing']})" if what == "missing" else "")
            )
    started = prod.get("started", 0.0)
    produce_s = prod.get("acked_at", 0.0) - started
    consume_s = cons.get("complete_at", 0.0) - started
    run: dict[str, Any] = {
        "status": "FAILED" if reasons else "OK",
        "reason": "; ".join(reasons),
        "records": n,
        "sent": prod.get("sent", 0),
        "received": cons.get("received", 0),
        "distinct": cons.get("distinct", 0),
        "missing": cons.get("missing", n),
        "duplicates": cons.get("duplicates", 0),
        "produce_rps": round(prod.get("sent", 0) / produce_s) if produce_s > 0 else 0,
        "consume_rps": round(cons.get("distinct", 0) / consume_s) if consume_s > 0 else 0,
        "e2e_ms": cons.get("latency_ms", {}),
        "ack_ms": prod.get("ack_ms", {}),
        "cpu_s": {
            "producer": round(prod.get("cpu_s", 0.0), 2),
            "consumer": round(cons.get("cpu_s", 0.0), 2),
            "servers": round(server_cpu, 2),
        },
    }
    if rate:
        run["latency_cdf_ms"] = cons.get("latency_cdf_ms", [])
    return run


def _line(adapter: Adapter, what: str, run: dict[str, Any]) -> str:
    e2e = run.get("e2e_ms", {})
    return (
        f"{adapter.name:<26} {what:<16} {run['status']:<6} produce {run.get('produce_rps', 0):>8}/s "
        f"consume {run.get('consume_rps', 0):>8}/s  e2e p50 {e2e.get('p50', 0)} p99 {e2e.get('p99', 0)} ms"
        + (f"  ({run['reason']})" if run.get("reason") else "")
    )


def summarize(values: list[float]) -> dict[str, float]:
    """min/median/max of the repetitions."""
    if not values:
        return {"min": 0.0, "median": 0.0, "max": 0.0}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def as_dict(result: SystemResult) -> dict[str, Any]:
    data = asdict(result)
    data["failed"] = result.failed
    ok = [r for r in result.throughput if r["status"] == "OK"]
    data["produce_rps"] = summarize([r["produce_rps"] for r in ok])
    data["consume_rps"] = summarize([r["consume_rps"] for r in ok])
    return data
