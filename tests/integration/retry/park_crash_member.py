"""A parking group member killed (SIGKILL, from inside) once every poison record is parked, before it
committed anything: ``python park_crash_member.py BOOTSTRAP GROUP TOPIC POISON_KEY PARKED``.

It fails every record of ``POISON_KEY`` and never commits (no auto-commit), so the next member reads the
partition again from offset 0 and meets records that are parked already.
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
    bootstrap, group, topic, poison, parked = sys.argv[1:6]
    with Client(bootstrap, request_timeout=10) as client:
        consumer = client.consumer(
            group,
            [topic],
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout="1s",
            fetch_max_wait="100ms",
            park_poison_keys=True,
            max_redeliver=3,
            park_retry_delay="2s",  # persisted: the next member waits it out too
        )
        park = consumer._park
        assert park is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for r in consumer.poll(0.1):
                if r.key == poison.encode() and not consumer.is_parked(r):
                    consumer.fail(r)
            pk = park.book.keys.get(((topic, 0), poison.encode()))
            if pk is not None and len(pk.pending) == int(parked):
                park.flush()  # every park write acknowledged; no offset committed
                os.kill(os.getpid(), signal.SIGKILL)
        sys.exit("the poison records were never all parked")


if __name__ == "__main__":
    main()
