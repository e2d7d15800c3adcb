"""Group consume throughput: 1,000,000 records over 4 partitions, one consumer process.

Two phases on one stack (coordinator, broker, offset store, private Redis):

* ``backlog``: the records are produced first; then one group consumer (``client.consumer``,
  background prefetch, auto-commit every 5 s) reads them all;
* ``concurrent``: a producer process writes while the consumer process reads.

Each side runs in its own process, so the figures are what one Python client process achieves.
Records are 100 B values with 16 B keys, as in ``log_throughput.py``. The consumer's rate is
measured from its first poll (after joining) to the last record.

``--commit async`` turns the auto-commit off and calls ``commit_async()`` after every poll
(counting each callback's outcome); it adds the commit_async calls/s, the commits/s actually
sent (calls coalesce: docs/consumer.md), the failed commits (expected: 0) and whether the
committed offsets equal the consumed positions before ``close()``'s final commit. Results go
to ``group_consume_async.json``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from collections.abc import Callable
from multiprocessing.queues import Queue
from typing import Any

from _stack import produce_keyed, save, stack


def produce(bootstrap: str, topic: str, n: int, out: Queue[Any]) -> None:
    out.put(("produce", n, produce_keyed(bootstrap, topic, n), {}))


def consume(
    bootstrap: str,
    topic: str,
    group: str,
    n: int,
    settings: dict[str, Any],
    out: Queue[Any],
) -> None:
    from sluice import Client

    settings = dict(settings)
    async_commits = settings.pop("commit") == "async"
    if async_commits:
        settings["enable_auto_commit"] = False
    with Client(bootstrap) as client:
        joined = time.perf_counter()
        consumer = client.consumer(group, [topic], auto_offset_reset="earliest", **settings)
        join_s = time.perf_counter() - joined
        extra: dict[str, object] = {"join_s": round(join_s, 3)}
        got = 0
        poll = consumer.poll
        started = time.perf_counter()
        if async_commits:
            outcomes = [0, 0]  # ok, failed

            def count(offsets: object, error: object) -> None:
                outcomes[error is not None] += 1

            commit_async = consumer.commit_async
            calls = 0
            while got < n:
                got += len(poll(1.0))
                commit_async(callback=count)
                calls += 1
            elapsed = time.perf_counter() - started
            deadline = time.monotonic() + 30
            while sum(outcomes) < calls and time.monotonic() < deadline:
                poll(0.01)  # runs the callbacks of the last commits
            stats = consumer.stats().commits
            positions = {tp: consumer.position(tp) for tp in consumer.assignment()}
            extra |= {
                "commit_async_calls_per_s": round(calls / elapsed),
                "commits_per_s": round(stats.sent / elapsed),
                "commits_sent": stats.sent,
                "commit_calls_coalesced": stats.coalesced,
                "commits_ok": outcomes[0],
                "commits_failed": outcomes[1],
                "async_committed_equals_positions": client.admin.group_offsets(group) == positions,
            }
        else:
            while got < n:
                got += len(poll(1.0))
            elapsed = time.perf_counter() - started
        consumer.close()
        extra["committed"] = sum(client.admin.group_offsets(group).values())
    out.put(("consume", got, elapsed, extra))


def run_phase(
    targets: list[tuple[Callable[..., None], tuple[object, ...]]],
) -> dict[str, tuple[int, dict[str, object]]]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=t, args=(*a, out)) for t, a in targets]
    for p in procs:
        p.start()
    results = {}
    for _ in procs:
        kind, count, elapsed, extra = out.get(timeout=900)
        results[kind] = (round(count / elapsed), extra)
    for p in procs:
        p.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--max-poll-records", type=int, default=500)
    parser.add_argument(
        "--fetch-min-bytes",
        type=int,
        default=1,
        help="consumer fetch_min_bytes (1, the default, answers as soon as anything is there)",
    )
    parser.add_argument(
        "--commit",
        choices=("auto", "async"),
        default="auto",
        help="auto: the auto-commit every 5 s; async: commit_async() after every poll",
    )
    parser.add_argument("--max-in-flight-commits", type=int, default=1, help="with --commit async")
    parser.add_argument(
        "--redis-fsync",
        choices=("off", "everysec", "always"),
        default="always",
        help="Redis AOF appendfsync policy (always: what `sluice up` and the chart run; off: no AOF)",
    )
    parser.add_argument("--tls", action="store_true", help="TLS on every port and every client connection")
    parser.add_argument(
        "--auth", action="store_true", help="authentication and ACL authorization on, clients with a JWT"
    )
    args = parser.parse_args()
    n, parts = args.records, args.partitions
    settings: dict[str, Any] = {
        "max_poll_records": args.max_poll_records,
        "fetch_min_bytes": args.fetch_min_bytes,
        "commit": args.commit,
    }
    if args.commit == "async":
        settings["max_in_flight_commits"] = args.max_in_flight_commits
    with stack(push=True, redis_fsync=args.redis_fsync, tls=args.tls, auth=args.auth) as s:
        from sluice import Client

        with Client(s.bootstrap) as client:
            client.admin.create_topic("bench", partitions=parts)
            client.admin.create_topic("bench-mixed", partitions=parts)
        run_phase([(produce, (s.bootstrap, "bench", n))])
        backlog_rps, backlog = run_phase([(consume, (s.bootstrap, "bench", "g-backlog", n, settings))])[
            "consume"
        ]
        both = run_phase(
            [
                (produce, (s.bootstrap, "bench-mixed", n)),
                (consume, (s.bootstrap, "bench-mixed", "g-mixed", n, settings)),
            ]
        )
    async_keys = (
        "commit_async_calls_per_s",
        "commits_per_s",
        "commits_sent",
        "commit_calls_coalesced",
        "commits_ok",
        "commits_failed",
        "async_committed_equals_positions",
    )
    phases = {"backlog": backlog, "concurrent": both["consume"][1]}
    save(
        ("group_consume" if args.commit == "auto" else "group_consume_async")
        + ("" if args.redis_fsync == "always" else f"_fsync_{args.redis_fsync}")
        + ("_tls" if args.tls else "")
        + ("_auth" if args.auth else ""),
        {
            "records": n,
            "partitions": parts,
            "redis_fsync": args.redis_fsync,
            "tls": args.tls,
            "auth": args.auth,
            **settings,
            "backlog_consume_rps": backlog_rps,
            "backlog_committed": backlog["committed"],
            "join_s": backlog["join_s"],
            "concurrent_consume_rps": both["consume"][0],
            "concurrent_produce_rps": both["produce"][0],
            "concurrent_committed": both["consume"][1]["committed"],
            **{f"{phase}_{k}": extra[k] for phase, extra in phases.items() for k in async_keys if k in extra},
        },
    )


if __name__ == "__main__":
    main()
