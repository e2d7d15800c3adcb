"""10,000 empty consumer groups: what they cost at idle, and their expiry (issue 20, "Groups that end").

Starts a private Redis, a coordinator, a broker and an offset store (real processes), creates one topic
and N groups; each group's member joins, commits an offset and leaves, so every group is empty with one
committed offset. Then measures, over ``--idle`` seconds, the coordinator's and the broker's CPU (from
/proc/<pid>/stat), and the size of the coordinator's /metrics. Last, it restarts the coordinator with a
short ``--group-offsets-retention`` and scans Redis until no key of any group is left (and the topic's
refs and the coordinator's records name none).

    .venv/bin/python bench/scale_groups.py --groups 10000
    .venv/bin/python bench/scale_groups.py --groups 750 --coordinator-arg=--group-metrics-max=100000

``--coordinator-arg`` passes a flag through (repeatable); ``--base-port`` puts every process on fixed
ports from there (default: free ports).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import redis

from _stack import cpu_seconds, save
from sluice.v1 import (
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    offset_store_pb2,
    offset_store_pb2_grpc,
)

if TYPE_CHECKING:
    from tests.harness import ServiceProcess

TOPIC = "scale"
PREFIX = "sluice"


def metrics_text(service: ServiceProcess) -> str:
    with urllib.request.urlopen(f"http://{service.metrics}/metrics", timeout=30) as response:
        return str(response.read().decode())


async def make_group(coordinator: Any, store: Any, name: str) -> None:
    """Join, commit offset 0 of partition 0, leave: an empty group with one committed offset."""
    joined = await coordinator.Heartbeat(
        coordinator_pb2.GroupHeartbeatRequest(group=name, member_epoch=0, subscription={TOPIC: "*"}),
        timeout=30,
    )
    assert joined.error.code == common_pb2.NONE, joined.error
    committed = await store.CommitOffsets(
        offset_store_pb2.CommitOffsetsRequest(
            group=name,
            member_id=joined.member_id,
            member_epoch=joined.member_epoch,
            offsets=[offset_store_pb2.PartitionOffset(topic=TOPIC, partition=0, offset=0)],
        ),
        timeout=30,
    )
    assert committed.results[0].error.code == common_pb2.NONE, committed
    left = await coordinator.Heartbeat(
        coordinator_pb2.GroupHeartbeatRequest(
            group=name, member_id=joined.member_id, member_epoch=-1, subscription={TOPIC: "*"}
        ),
        timeout=30,
    )
    assert left.error.code == common_pb2.NONE, left.error


async def make_groups(coordinator: str, store: str, names: list[str], concurrency: int) -> float:
    started = time.perf_counter()
    async with grpc.aio.insecure_channel(coordinator) as c, grpc.aio.insecure_channel(store) as s:
        coord_stub: Any = coordinator_pb2_grpc.CoordinatorStub(c)  # grpc.aio: awaitable calls
        store_stub: Any = offset_store_pb2_grpc.OffsetStoreStub(s)
        queue = list(reversed(names))

        async def worker() -> None:
            while queue:
                await make_group(coord_stub, store_stub, queue.pop())

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started


def group_keys(r: redis.Redis, deadline_s: float = 60.0) -> int:
    """Keys of any group (``{P}:grp:*`` and ``{P}:off:*``), by a full SCAN."""
    count = 0
    end = time.monotonic() + deadline_s
    for pattern in (f"{PREFIX}:grp:*", f"{PREFIX}:off:*"):
        for _ in r.scan_iter(match=pattern, count=5000):
            count += 1
            if time.monotonic() > end:
                raise TimeoutError("SCAN took too long")
    return count


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def leftovers(r: redis.Redis) -> dict[str, int]:
    fields = map(_text, r.hkeys(f"{PREFIX}:coordinator:records"))
    records = [f for f in fields if f.startswith(("group:", "grpconfig:"))]
    refs = [f for f in map(_text, r.hkeys(f"{PREFIX}:topic:{{{TOPIC}}}:refs")) if ":off:" in f]
    return {"group_keys": group_keys(r), "group_records": len(records), "topic_refs_of_groups": len(refs)}


def idle_cpu(processes: dict[str, ServiceProcess], seconds: float) -> dict[str, float]:
    """Percent of one core each process used over ``seconds``."""
    before = {name: cpu_seconds(p.process.pid) for name, p in processes.items()}
    time.sleep(seconds)
    return {
        name: 100 * (cpu_seconds(p.process.pid) - before[name]) / seconds for name, p in processes.items()
    }


@contextlib.contextmanager
def redis_server(port: int) -> Iterator[str]:
    from tests.harness import _start_redis  # on the path once _stack is imported

    with tempfile.TemporaryDirectory(prefix="sluice-scale-redis-") as d:
        proc = _start_redis(port, Path(d), False, "always")
        try:
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(10)


def main() -> None:
    from tests.harness import free_port, start_service  # on the path once _stack is imported

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idle CPU measured")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds waited before measuring")
    parser.add_argument("--retention", default="5s", help="retention of the restarted coordinator")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--base-port", type=int, default=0)
    parser.add_argument("--coordinator-arg", action="append", default=[])
    parser.add_argument("--skip-expiry", action="store_true")
    parser.add_argument("--name", default="scale_groups")
    args = parser.parse_args()

    def port(offset: int) -> str:
        return str(args.base_port + offset) if args.base_port else "0"

    result: dict[str, object] = {"groups": args.groups, "coordinator_args": args.coordinator_arg}
    with tempfile.TemporaryDirectory(prefix="sluice-scale-") as d, contextlib.ExitStack() as running:
        url = running.enter_context(redis_server(args.base_port or free_port()))

        def started(sp: ServiceProcess) -> ServiceProcess:
            running.callback(sp.terminate)
            return sp

        def coordinator(*extra: str) -> ServiceProcess:
            return start_service(
                "coordinator", "--port", port(1), "--metrics-port", port(2), "--redis-url", url,
                *args.coordinator_arg, *extra,
            )  # fmt: skip

        coord = coordinator()
        broker = started(
            start_service(
                "broker", "--port", port(3), "--metrics-port", port(4), "--broker-id", "0",
                "--data-dir", str(Path(d) / "broker"), "--coordinator", coord.address,
            )
        )  # fmt: skip
        store = started(
            start_service("offset-store", "--port", port(5), "--metrics-port", port(6), "--redis-url", url)
        )
        with grpc.insecure_channel(coord.address) as channel:
            coordinator_pb2_grpc.CoordinatorStub(channel).CreateTopic(
                coordinator_pb2.CreateTopicRequest(name=TOPIC, partitions=1), timeout=30
            )
        names = [f"g-{i:05d}" for i in range(args.groups)]
        took = asyncio.run(make_groups(coord.address, store.address, names, args.concurrency))
        result["create_s"] = round(took, 1)
        print(f"{args.groups} empty groups created in {took:.1f}s")
        time.sleep(args.settle)
        cpu = idle_cpu({"coordinator": coord, "broker": broker}, args.idle)
        text = metrics_text(coord)
        result["idle_cpu_percent"] = {k: round(v, 2) for k, v in cpu.items()}
        result["idle_cpu_percent_total"] = round(sum(cpu.values()), 2)
        result["metrics_bytes"] = len(text.encode())
        per_group = [line.split("{")[0] for line in text.splitlines() if 'group="' in line]
        result["metrics_group_series"] = len(per_group)
        result["metrics_groups_exported"] = len(
            {line.split('group="')[1].split('"')[0] for line in text.splitlines() if 'group="' in line}
        )
        result["metrics_series_by_name"] = {n: per_group.count(n) for n in sorted(set(per_group))}
        print(
            f"idle CPU over {args.idle:.0f}s: coordinator {cpu['coordinator']:.2f}%, "
            f"broker {cpu['broker']:.2f}% of a core; /metrics {len(text.encode()):,} bytes"
        )
        r = redis.Redis.from_url(url)
        result["before_expiry"] = leftovers(r)
        print("before expiry:", result["before_expiry"])
        if not args.skip_expiry:
            coord.terminate()
            coord = started(coordinator("--group-offsets-retention", args.retention))
            started_at = time.monotonic()
            while True:
                left = leftovers(r)
                if not any(left.values()) or time.monotonic() - started_at > 120:
                    break
                time.sleep(0.5)
            result["after_expiry"] = left
            result["expiry_s"] = round(time.monotonic() - started_at, 1)
            print(f"after a restart with retention {args.retention}: {left} in {result['expiry_s']}s")
            cpu = idle_cpu({"coordinator": coord, "broker": broker}, min(args.idle, 10))
            result["idle_cpu_percent_after_expiry"] = {k: round(v, 2) for k, v in cpu.items()}
        else:
            coord.terminate()
        r.close()
    save(args.name, result)


if __name__ == "__main__":
    main()
