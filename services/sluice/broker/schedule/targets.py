"""The topics a produce to the schedule topic would deliver to: what the broker authorizes it against.

A delayed record waits in ``__sluice_schedule`` and the scheduler appends it to its real topic with the
scheduler's own identity. Without a check at produce time, a principal allowed to write the schedule
topic could get records into any topic. So the broker, with authorization on, reads the envelope of
every record produced to the schedule topic and authorizes WRITE on each target topic for the
producer's principal (Kafka's rule: a write is authorized when it is made, not when it is read).
Records without a valid envelope are left alone: the scheduler skips them (``entry.entry_of``).
"""

from __future__ import annotations

from sluice.client.producer.delay import SCHEDULE_TOPIC, TARGET_HEADER
from sluice.codec.batch import decode_records

__all__ = ["SCHEDULE_TOPIC", "schedule_targets"]


def schedule_targets(records: bytes, partition: int) -> set[str]:
    """The distinct target topics named by the records of a produce to the schedule topic.

    Raises CorruptBatch for batches that do not decode (the append would refuse them too)."""
    targets: set[str] = set()
    for record in decode_records(records, SCHEDULE_TOPIC, partition):
        target = record.headers.get(TARGET_HEADER) if record.headers else None
        if target:
            targets.add(target.decode(errors="replace"))
    return targets
