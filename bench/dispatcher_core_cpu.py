"""The dispatcher's CPU per record on the push path, without transports: what a Shared subscription
does for issue 19's compare workload ("Sluice push, Shared"), in one thread, timed with the process
CPU clock, so the figure is the same on a loaded machine as on a quiet one.

Per fetched answer (one log batch of ``--batch`` records of a 16-byte key and a 100-byte value, as
the producer sends them): index it (``batch_views``), make the messages (``messages_of``), offer them to
the subscription; then, as the SDK does, one consumer grants ``Flow`` permits when it has taken half
of its 1,000-message queue, every delivery is encoded for the wire (``encode_batches_event``), and
acks come back as ``Ack.ranges`` in groups of up to 1,000 (``ack_offsets`` + ``Subscription.ack``).

    PYTHONPATH=services .venv/bin/python bench/dispatcher_core_cpu.py --records 300000
    PYTHONPATH=services .venv/bin/python bench/dispatcher_core_cpu.py --profile   # cProfile top 25
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

from sluice.codec.batch import BatchBuilder, batch_views, stamp
from sluice.codec.filter import parse_filter
from sluice.dispatcher.consumer import ConsumerSpec
from sluice.dispatcher.cursor import PartitionCursor
from sluice.dispatcher.messages import encode_batches_event, messages_of
from sluice.dispatcher.model import Effects, SubscriptionSettings, SubscriptionType
from sluice.dispatcher.requests import ack_offsets
from sluice.dispatcher.subscription import Subscription

QUEUE = 1000


def _batches(records: int, per_batch: int) -> list[tuple[int, bytes]]:
    out = []
    offset = 0
    value = b"v" * 100
    while offset < records:
        n = min(per_batch, records - offset)
        b = BatchBuilder()
        for i in range(n):
            b.append(value, b"%016d" % (offset + i), None, None, 1_000 + i)
        raw = bytearray(b.build())
        stamp(raw, 0, offset, 1, 0)
        out.append((offset, bytes(raw)))
        offset += n
    return out


def run(records: int, per_batch: int) -> float:
    """CPU seconds per record of the whole push path of one Shared consumer."""
    batches = _batches(records, per_batch)
    settings = SubscriptionSettings(
        type=SubscriptionType.SHARED, filter=parse_filter("*"), read_ahead_bytes=4 << 20
    )
    sub = Subscription("t", "s", settings)
    sub.attach_partition(PartitionCursor(0), 0)
    sub.activate(0)
    c, _ = sub.add_consumer(ConsumerSpec(consumer_id="c", name="c", max_unacked=50_000), settings, 0)
    queue: list[tuple[int, int]] = []  # (offset, end) runs the consumer holds, not yet acked
    taken = 0
    acked = 0

    def apply(fx: Effects) -> None:
        nonlocal taken
        for d in fx.deliveries.values():
            encode_batches_event("t", d.messages, d.counts)
            offs = [m.offset for m in d.messages]
            queue.append((offs[0], offs[-1] + 1))  # Shared with one consumer: consecutive
            taken += len(offs)

    start = time.process_time()
    apply(sub.flow(c, QUEUE, 0))
    for base, raw in batches:
        views = batch_views(raw)
        msgs = messages_of(views, 0, base)
        apply(sub.offer(0, msgs, base + len(msgs), 0))
        while queue:
            bounds: list[int] = []
            n = 0
            while queue and n < QUEUE:
                s, e = queue.pop(0)
                bounds += (s, e)
                n += e - s
            ids = ack_offsets({}, [(0, bounds)])
            fx, bad = sub.ack(c, ids, False, 0)
            assert not bad
            acked += n
            apply(fx)
            apply(sub.flow(c, n, 0))
    cpu = time.process_time() - start
    assert acked == records, (acked, records)
    return cpu / records


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--batch", type=int, default=500, help="records per log batch (fetched answer)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    opts = parser.parse_args()
    if opts.profile:
        prof = cProfile.Profile()
        prof.enable()
        run(opts.records, opts.batch)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    got = [run(opts.records, opts.batch) * 1e6 for _ in range(opts.runs)]
    print(
        f"dispatcher core CPU per record: median {statistics.median(got):.3f} us "
        f"(min {min(got):.3f}, max {max(got):.3f}; {opts.runs} runs of {opts.records} records, "
        f"batches of {opts.batch})"
    )


if __name__ == "__main__":
    main()
