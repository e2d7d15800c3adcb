"""Where a record's time goes inside the broker: one histogram, ``sluice_broker_stage_seconds{stage}``.

Observed once per request or answer (a batch of records), never per record, with the SDK's cheap
histogram (``common/stage_histogram.py``; prometheus-client's ``observe`` cost 3% of a record's CPU here),
read by a collector when Prometheus scrapes (docs/latency.md, docs/metrics.md):

- ``produce``: a wire produce frame, from parsed to its answer handed to the transport (under
  ``flush=interval``; under ``always`` to its append, the fsync wait is ``produce_flush_seconds``). It
  includes the append and the answers of the followed fetches the append woke, which run inside it;
- ``follow_answer``: one answer of a followed (continuous) fetch, from its read being ready (the
  append's wake-up, or the round's start when data was already there) to the frame handed to the
  transport: the broker's share of the consumer's latency after an append;
- ``commit``: a wire produce frame whose answer waited (acks=all on a replicated partition, or
  ``flush=always``), from parsed to its answer handed to the transport: on a leader, the replication
  round (its followers' fetch, append and next fetch) plus what queued before it;
- ``replica_apply``: on a follower, one fetch answer from its arrival to the next fetch's frame
  written (the CRC check and append of the batches: the follower's share of a commit).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from sluice.common.stage_histogram import StageHistogram, histogram_family

__all__ = ["COMMIT", "FOLLOW_ANSWER", "PRODUCE", "REPLICA_APPLY", "STAGES"]

# 10 us .. 1 s: the stages are tens to hundreds of microseconds; the tail is what a stall adds.
STAGE_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 1.0)

PRODUCE = StageHistogram(STAGE_BUCKETS)
FOLLOW_ANSWER = StageHistogram(STAGE_BUCKETS)
COMMIT = StageHistogram(STAGE_BUCKETS)
REPLICA_APPLY = StageHistogram(STAGE_BUCKETS)
STAGES = {
    "produce": PRODUCE,
    "follow_answer": FOLLOW_ANSWER,
    "commit": COMMIT,
    "replica_apply": REPLICA_APPLY,
}


class _StageCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        yield histogram_family(
            "sluice_broker_stage_seconds",
            "Time a produce request or a followed fetch's answer spent in one stage of the broker",
            "stage",
            STAGES,
        )


REGISTRY.register(_StageCollector())
