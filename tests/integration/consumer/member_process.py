"""A group member in a process of its own (crash tests):
``python member_process.py BOOTSTRAP GROUP TOPIC [SESSION_TIMEOUT [FILTER]]``.

Prints ``JOINED <member_id>`` once in the group, then ``R <partition> <offset> <unix time> <tag>`` for every
record it processes (flushed after each poll, before the next poll, which is what makes the previous poll's
records committable). Auto-commits every 200 ms. SIGTERM closes it cleanly (``CLOSED``).
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "services"))

from sluice import Client


def main() -> None:
    bootstrap, group, topic = sys.argv[1:4]
    session_timeout = sys.argv[4] if len(sys.argv) > 4 else "2s"
    topic_filter = sys.argv[5] if len(sys.argv) > 5 else "*"
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    out = sys.stdout
    with Client(bootstrap, request_timeout=10) as client:
        consumer = client.consumer(
            group,
            {topic: topic_filter},
            auto_offset_reset="earliest",
            auto_commit_interval="200ms",
            session_timeout=session_timeout,
            fetch_max_wait="100ms",
        )
        out.write(f"JOINED {consumer.member_id}\n")
        out.flush()
        while not stop:
            records = consumer.poll(0.1)
            if records:
                now = time.time()
                out.write("".join(f"R {r.partition} {r.offset} {now:.3f} {r.tag or '-'}\n" for r in records))
                out.flush()
        consumer.close()
    out.write("CLOSED\n")
    out.flush()


if __name__ == "__main__":
    main()
