"""A gzip decompression bomb against a real broker's Produce, by hand (docs/limits.md, "Decompression").

    PYTHONPATH=services:. python bench/decompression_bomb.py --mib 1024 --streams 4

Starts a private Redis, a coordinator and a broker, sends ``--streams`` concurrent gRPC messages of
``--mib`` MiB of zeros compressed with gzip (about 1 MB each on the wire), and prints each answer and the
broker's peak RSS (VmHWM) before and after. The client builds each message in memory first (``--mib`` MiB).
With the services' identity-only compression setting the broker answers UNIMPLEMENTED before inflating a
byte; without it, gRPC inflates up to the 64 MiB message limit per stream before RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from tests.harness import ServiceProcess, run_redis, start_service


def hwm_mb(sp: ServiceProcess) -> float:
    match = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{sp.process.pid}/status").read_text())
    return int(match.group(1)) / 1024 if match else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=1024, help="inflated size of one bomb")
    parser.add_argument("--streams", type=int, default=1, help="bombs sent at once")
    args = parser.parse_args()
    with run_redis() as redis, tempfile.TemporaryDirectory(prefix="sluice-bomb-") as d:
        coordinator = start_service(
            "coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url
        )
        broker = start_service(
            "broker",
            *("--port", "0", "--metrics-port", "0", "--data-dir", str(Path(d) / "b")),
            *("--broker-id", "1", "--coordinator", coordinator.address),
        )
        try:
            before = hwm_mb(broker)
            bomb = bytes(args.mib << 20)
            options = [("grpc.max_send_message_length", -1)]
            with grpc.insecure_channel(
                broker.address, options=options, compression=grpc.Compression.Gzip
            ) as ch:
                produce = ch.unary_unary("/sluice.v1.Broker/Produce", None, None)

                def send(_: int) -> str:
                    try:
                        produce(bomb, timeout=300)
                        return "OK"
                    except grpc.RpcError as exc:
                        return f"{exc.code().name}: {exc.details()}"

                started = time.monotonic()
                with ThreadPoolExecutor(args.streams) as pool:
                    answers = list(pool.map(send, range(args.streams)))
            print(f"{args.streams} x {args.mib} MiB bombs in {time.monotonic() - started:.1f}s: {answers}")
            print(f"broker peak RSS {before:.0f} MB before, {hwm_mb(broker):.0f} MB after")
        finally:
            broker.terminate()
            coordinator.terminate()


if __name__ == "__main__":
    main()
