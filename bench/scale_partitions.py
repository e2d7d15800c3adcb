"""P partitions on one broker under a lowered soft open-files limit (issue 20, "Descriptors").

Starts Redis, a coordinator and one broker with the soft RLIMIT_NOFILE lowered to ``--soft-limit``
(default 1,024; the hard limit is left as it is, so the services can raise the soft one, as they
do at start-up). Then:

1. creates ``--partitions`` partitions (default 10,000) as topics of ``--chunk`` (1,000) partitions
   through ``CreateTopic``, timing each chunk against the partitions already there: from the call
   until the broker serves every partition of the topic (``ListOffsets`` answers without error);
2. produces one small batch to every partition and fetches every partition from offset 0 (straight
   to the broker over gRPC, ``--chunk`` partitions per request);
3. reports the broker's soft limit, descriptors (``/proc/<pid>/fd``), RSS and idle CPU over
   ``--idle`` seconds;
4. restarts the broker (SIGTERM, start again on the same data dir), reports the time to ready, the
   same figures, and fetches every partition again to check nothing was lost.

Before issue 20 the broker held 3 descriptors per new partition and never raised the limit: it
stopped accepting connections at about 330 partitions under a 1,024 soft limit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from _stack import cpu_seconds, rss_mb, save, stack

if TYPE_CHECKING:
    from tests.harness import ServiceProcess

#: How long a chunk may take to be served (or a busy broker to answer) before the bench gives up:
#: a broker applies an assignment on its event loop, and creating 1,000 partitions there takes
#: 20-80 s on a busy shared disk (two fsyncs per partition), during which calls time out.
RETRY_UNTIL_S = 600.0
#: Per call: past it, the call is retried (the broker was busy), until RETRY_UNTIL_S.
CALL_TIMEOUT_S = 30.0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def soft_limit(pid: int) -> int:
    text = Path(f"/proc/{pid}/limits").read_text()
    m = re.search(r"^Max open files\s+(\d+)", text, re.MULTILINE)
    return int(m.group(1)) if m else -1


def idle_cpu_percent(pid: int, seconds: float) -> float:
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return round((cpu_seconds(pid) - before) / seconds * 100, 2)


def broker_figures(broker: ServiceProcess, idle_s: float) -> dict[str, Any]:
    pid = broker.process.pid
    return {
        "soft_limit": soft_limit(pid),
        "open_fds": open_fds(pid),
        "rss_mb": round(rss_mb(pid), 1),
        "idle_cpu_percent": idle_cpu_percent(pid, idle_s),
    }


def each_chunk(
    stub: Any, topics: list[str], chunk: int, request: Any, answer: Any, pause_s: float = 0.2
) -> None:
    """Send ``request(topic, partitions)`` per topic until every partition answers without error
    (a partition not yet served answers NOT_LEADER/UNKNOWN for a moment after CreateTopic)."""
    for topic in topics:
        pending = list(range(chunk))
        deadline = time.monotonic() + RETRY_UNTIL_S
        while pending:
            try:
                parts = answer(request(topic, pending)).partitions
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                    raise
                if time.monotonic() > deadline:
                    raise
                print(f"  {topic}: the broker is busy ({err.code().name}); retrying", flush=True)
                continue
            pending = [p.partition for p in parts if p.error.code]
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: {len(pending)} partitions still failing: {parts[0].error}")
            if pending:
                time.sleep(pause_s)


def create_topic(client: Any, topic: str, partitions: int) -> None:
    """CreateTopic, retried while the coordinator reports no live broker: a broker applying a
    large assignment can miss heartbeats for a while (issue 20, creation cost)."""
    from sluice.errors import BrokerNotAvailable

    deadline = time.monotonic() + RETRY_UNTIL_S
    while True:
        try:
            client.admin.create_topic(topic, partitions=partitions)
            return
        except BrokerNotAvailable as err:
            if time.monotonic() > deadline:
                raise
            print(f"  {topic}: {err.message[:100]}; retrying", flush=True)
            time.sleep(1.0)


def broker_stub(address: str) -> Any:

    from sluice.client.rpc import CHANNEL_OPTIONS
    from sluice.v1 import broker_pb2_grpc

    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    return channel, broker_pb2_grpc.BrokerStub(channel)


def wait_served(stub: Any, topic: str, chunk: int) -> None:
    """Until the broker answers ListOffsets for every partition of ``topic`` without error."""
    from sluice.v1 import broker_pb2 as pb

    def latest(t: str, partitions: list[int]) -> Any:
        parts = [pb.ListOffsetsPartition(topic=t, partition=p, timestamp=-1) for p in partitions]
        return stub.ListOffsets(pb.ListOffsetsRequest(partitions=parts), timeout=CALL_TIMEOUT_S)

    each_chunk(stub, [topic], chunk, latest, lambda r: r, pause_s=0.02)


def produce_and_fetch(address: str, topics: list[str], chunk: int, batch: bytes) -> tuple[float, float]:

    from sluice.client.rpc import CHANNEL_OPTIONS
    from sluice.v1 import broker_pb2 as pb
    from sluice.v1 import broker_pb2_grpc

    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)

        def produce(topic: str, partitions: list[int]) -> Any:
            parts = [pb.ProducePartition(topic=topic, partition=p, records=batch) for p in partitions]
            return stub.Produce(pb.ProduceRequest(acks=1, partitions=parts), timeout=CALL_TIMEOUT_S)

        def fetch(topic: str, partitions: list[int]) -> Any:
            parts = [pb.FetchPartition(topic=topic, partition=p, fetch_offset=0) for p in partitions]
            resp = stub.Fetch(pb.FetchRequest(partitions=parts, max_bytes=64 << 20), timeout=CALL_TIMEOUT_S)
            for p in resp.partitions:
                if not p.error.code and not p.records:
                    raise RuntimeError(f"{topic}/{p.partition}: fetched nothing from offset 0")
            return resp

        t0 = time.perf_counter()
        if batch:
            each_chunk(stub, topics, chunk, produce, lambda r: r)
        t1 = time.perf_counter()
        each_chunk(stub, topics, chunk, fetch, lambda r: r)
        t2 = time.perf_counter()
    return round(t1 - t0, 2), round(t2 - t1, 2)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--chunk", type=int, default=1_000, help="partitions per topic (and per timing)")
    parser.add_argument("--soft-limit", type=int, default=1_024)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measurement")
    parser.add_argument("--no-save", action="store_true", help="print the result, do not write bench/results")
    args = parser.parse_args()
    if args.partitions % args.chunk:
        parser.error("--partitions must be a multiple of --chunk")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # The services inherit this soft limit, as they would from a shell or a container runtime.
    resource.setrlimit(resource.RLIMIT_NOFILE, (args.soft_limit, hard))

    from tests.harness import restart  # importable once _stack has set sys.path

    from sluice import Client
    from sluice.codec.batch import BatchBuilder

    builder = BatchBuilder()
    builder.append(b"x" * 100, b"k", None, None, 1_000)
    batch = builder.build()
    topics = [f"scale-{i:03d}" for i in range(args.partitions // args.chunk)]
    creation: list[dict[str, float]] = []
    with stack(flush="interval") as s:
        broker = s.broker
        started = {"soft_limit": soft_limit(broker.process.pid), "open_fds": open_fds(broker.process.pid)}
        print(f"broker started: {started} (hard limit {hard})", flush=True)
        channel, stub = broker_stub(broker.address)
        with channel, Client(s.bootstrap) as client:
            for i, topic in enumerate(topics):
                t0 = time.perf_counter()
                create_topic(client, topic, args.chunk)
                wait_served(stub, topic, args.chunk)
                seconds = time.perf_counter() - t0
                creation.append({"existing": i * args.chunk, "seconds": round(seconds, 2)})
                existing = i * args.chunk
                print(f"created {topic}: {args.chunk} partitions, {existing} existing, in {seconds:.2f} s")
        produce_s, fetch_s = produce_and_fetch(broker.address, topics, args.chunk, batch)
        print(f"produced to all in {produce_s} s, fetched all in {fetch_s} s", flush=True)
        loaded = broker_figures(broker, args.idle)
        print(f"with {args.partitions} partitions: {loaded}", flush=True)

        broker.terminate(60)
        t0 = time.perf_counter()
        again = restart(broker, timeout=600)
        try:
            restart_s = round(time.perf_counter() - t0, 2)
            print(f"restarted in {restart_s} s", flush=True)
            _, refetch_s = produce_and_fetch(again.address, topics, args.chunk, b"")
            restarted = broker_figures(again, args.idle)
            print(f"after the restart: {restarted}", flush=True)
        finally:
            again.terminate(60)
    result = {
        "partitions": args.partitions,
        "soft_limit_given": args.soft_limit,
        "hard_limit": hard,
        "broker_at_start": started,
        "creation_seconds_per_chunk": creation,
        "chunk": args.chunk,
        "produce_all_s": produce_s,
        "fetch_all_s": fetch_s,
        "loaded": loaded,
        "restart_to_ready_s": restart_s,
        "fetch_all_after_restart_s": refetch_s,
        "restarted": restarted,
    }
    if args.no_save:
        print(json.dumps(result))
    else:
        save(f"scale_partitions_{args.partitions}", result)


if __name__ == "__main__":
    main()
