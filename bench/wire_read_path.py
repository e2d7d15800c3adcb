"""The wire server's read path alone: CPU per frame with the read buffer that starts at 16 KiB and
grows (``server/wire.py``) against a fixed 256 KiB one (what every connection allocated before).

One process: a ``WireListener`` on uvloop (as the services run) whose connection only counts
frames, and a client thread that streams frames at it over loopback (``--frame-bytes``, pipelined,
as a producer's batches or a consumer's acks arrive). The figure is the CPU time of the event loop's
thread per frame and per MB, so the client's own work is not in it. Rounds alternate between the two
buffer policies; medians are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import threading
import time

import uvloop

from _stack import save
from sluice.common.wire import HEADER, FrameType, Payload
from sluice.server import wire
from sluice.server.wire import WireConnection, WireListener
from sluice.v1 import wire_pb2

GROWING = (wire.READ_BUFFER_MIN, wire.READ_BUFFER_MAX)
FIXED = (wire.READ_BUFFER_MAX, wire.READ_BUFFER_MAX)


class _Counting(WireConnection):
    frames = 0
    done: asyncio.Event | None = None
    wanted = 0

    def on_frame(self, kind: int, payload: Payload) -> None:
        _Counting.frames += 1
        if _Counting.frames >= _Counting.wanted and _Counting.done is not None:
            _Counting.done.set()


def _client(port: int, frame: bytes, count: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        hello = wire_pb2.WireHello(version=1, client_id="bench").SerializeToString()
        sock.sendall(HEADER.pack(len(hello) + 1, FrameType.HELLO) + hello)
        chunk = frame * max(1, (1 << 20) // len(frame))  # about 1 MiB per sendall
        per_chunk = len(chunk) // len(frame)
        sent = 0
        while sent < count:
            n = min(per_chunk, count - sent)
            sock.sendall(chunk if n == per_chunk else frame * n)
            sent += n
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(1 << 16):  # the hello answer, then the close
            pass


async def _round(frame_bytes: int, count: int) -> float:
    """CPU seconds of the loop's thread to read ``count`` frames."""
    _Counting.frames = 0
    _Counting.wanted = count
    _Counting.done = asyncio.Event()
    listener = WireListener("bench", _Counting, "127.0.0.1", 0)
    port = await listener.start()
    payload = b"x" * (frame_bytes - 1)
    frame = HEADER.pack(len(payload) + 1, FrameType.CONSUME) + payload
    thread = threading.Thread(target=_client, args=(port, frame, count), daemon=True)
    cpu = time.thread_time()
    thread.start()
    await asyncio.wait_for(_Counting.done.wait(), 300)
    cpu = time.thread_time() - cpu
    await listener.stop()
    thread.join(60)
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--megabytes", type=int, default=512, help="per round")
    parser.add_argument("--rounds", type=int, default=7, help="per policy")
    args = parser.parse_args()
    results: dict[str, object] = {}
    for frame_bytes in (1 << 20, 64 * 1024, 1024, 100):
        count = max(1, args.megabytes * (1 << 20) // frame_bytes)
        if frame_bytes < 1024:
            count //= 8  # small frames cost per frame, not per byte: fewer of them
        runs: dict[str, list[float]] = {"fixed_256k": [], "growing_16k": []}
        for _ in range(args.rounds):
            for name, (start, top) in (("fixed_256k", FIXED), ("growing_16k", GROWING)):
                wire.READ_BUFFER_MIN, wire.READ_BUFFER_MAX = start, top
                with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                    runs[name].append(runner.run(_round(frame_bytes, count)))
        wire.READ_BUFFER_MIN, wire.READ_BUFFER_MAX = GROWING
        row = {
            name: {
                "us_per_frame": round(statistics.median(r) / count * 1e6, 3),
                "ms_per_mb": round(statistics.median(r) / (count * frame_bytes / 1e6) * 1e3, 3),
                "cpu_s_runs": [round(x, 3) for x in r],
            }
            for name, r in runs.items()
        }
        results[f"{frame_bytes}_byte_frames"] = {"frames": count, **row}
        print(frame_bytes, row, flush=True)
    save("wire_read_path", results)


if __name__ == "__main__":
    main()
