"""``buffer_memory`` / ``max_block`` (docs/memory.md, "SDK"): ``send`` blocks once the producer
holds ``buffer_memory`` bytes of records, open batches included, then raises RequestTimedOut.

No broker answers (the metadata names port 9), so nothing is ever acknowledged and every
batch stays held: the buffer can only fill.
"""

from __future__ import annotations

import time
from typing import Any

from sluice.client.metadata import ClusterMetadata
from sluice.client.producer import Producer, ProducerConfig
from sluice.common.peers import Peers
from sluice.errors import RequestTimedOut
from tests.unit.client.test_producer_send import StaticMetadata as _Static


class StaticMetadata(_Static):
    """The sender thread's view too: the metadata never changes."""

    def current(self) -> ClusterMetadata:
        return self.md

    def get(self, topics: Any = None, refresh: bool = False, retry: bool = True) -> ClusterMetadata:
        return self.md


KiB = 1024
BUFFER = 256 * KiB
BATCH = 64 * KiB
RECORD = 4 * KiB


def _fill(partitions: int) -> tuple[int, float, Exception | None]:
    """Send keyed records round robin over ``partitions`` until send raises (bounded);
    returns the record bytes accepted, how long the failing send blocked, its error."""
    cfg = ProducerConfig().replace(
        linger="1h",
        batch_size=BATCH,
        buffer_memory=BUFFER,
        max_block="300ms",
        enable_idempotence=False,
    )
    channels = Peers()
    producer = Producer("t", cfg, channels, StaticMetadata(partitions))  # type: ignore[arg-type]
    accepted = 0
    try:
        for i in range(4 * BUFFER // RECORD):  # far more than fits
            started = time.monotonic()
            try:
                producer.send(b"x" * RECORD, key=b"k%d" % (i % partitions), partition=i % partitions)
            except RequestTimedOut as exc:
                return accepted, time.monotonic() - started, exc
            accepted += RECORD
        return accepted, 0.0, None
    finally:
        producer.close(0)
        channels.close()


def test_send_blocks_for_max_block_then_raises_a_typed_error() -> None:
    accepted, blocked, err = _fill(1)
    assert isinstance(err, RequestTimedOut), "send never blocked although nothing is acknowledged"
    assert "buffer_memory" in str(err)
    assert blocked >= 0.29
    assert BUFFER - BATCH <= accepted <= BUFFER + BATCH


def test_open_batches_count_against_buffer_memory() -> None:
    # 16 partitions x one open 64 KiB batch each would be 1 MiB: four times the buffer. Before
    # open batches counted, send went on until each partition's batch had filled.
    accepted, _, err = _fill(16)
    assert isinstance(err, RequestTimedOut)
    assert accepted <= BUFFER + BATCH, f"{accepted} bytes accepted with buffer_memory={BUFFER}"
