"""A group member that dies (SIGKILL, from inside) right after reconsume_later's retry write and before
its commit: ``python crash_member.py BOOTSTRAP GROUP TOPIC LEVELS VALUE``.

Prints ``JOINED`` once in the group; never commits anything on its own (no auto-commit), so the next
member starts from the beginning and meets the failed record again.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "services"))

from sluice import Client


def main() -> None:
    bootstrap, group, topic, levels, value = sys.argv[1:6]
    with Client(bootstrap, request_timeout=10) as client:
        consumer = client.consumer(
            group,
            [topic],
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout="1s",
            fetch_max_wait="100ms",
            retry=True,
            retry_delay_levels=levels,
        )
        print("JOINED", flush=True)
        retrier = consumer._retry
        assert retrier is not None
        retrier.after_write = lambda: os.kill(os.getpid(), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for r in consumer.poll(0.1):
                if r.value == value.encode():
                    consumer.reconsume_later(r)  # killed inside, after the write
        sys.exit("the record never came")


if __name__ == "__main__":
    main()
