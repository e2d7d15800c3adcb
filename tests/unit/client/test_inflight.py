"""Up to five batches of a partition in flight with idempotence (issue 14, Kafka's rule): the accumulator's
room per partition, and the sender's settling of answers, driven with a fake clock and hand-made broker
answers (no threads, no network). What must hold: never more than ``max_in_flight`` batches of a partition
in flight; after a retriable failure nothing new goes out until the in-flight ones are back; the failed
batch and those refused behind it (OUT_OF_ORDER_SEQUENCE) go again in creation order, each alone in its run,
with their first sequences; a real gap fails one batch and moves the producer to a new epoch."""

from __future__ import annotations

import random
import threading
from typing import Any, cast

import pytest

from sluice.client.producer.accumulator import Accumulator, ProducerBatch
from sluice.client.producer.config import ProducerConfig
from sluice.client.producer.idempotence import Idempotence, Identity
from sluice.client.producer.partitioner import StickyPartitioner
from sluice.client.producer.sender import Sender
from sluice.errors import InvalidArgument, NotEnoughReplicas, NotLeader, OutOfOrderSequence, SluiceError
from sluice.v1 import broker_pb2
from tests.unit.client.test_accumulator import Clock

BROKER = "127.0.0.1:9"


class Rig:
    """An accumulator of one partition, an idempotent identity, and a sender whose answers are handed in."""

    def __init__(self, max_in_flight: int = 5) -> None:
        self.clock = Clock()
        self.acc = Accumulator(
            "t",
            1,
            StickyPartitioner(1, random.Random(1)),
            batch_size=1024,
            linger=0.0,
            delivery_timeout=60.0,
            clock=self.clock,
            max_in_flight_batches=max_in_flight,
        )
        self.idem = Idempotence(Identity(7, 0), partitions=1)
        config = ProducerConfig().replace(retry_backoff="10ms", retry_backoff_max="10ms")
        none = cast(Any, None)
        self.sender = Sender(
            "t",
            self.acc,
            threading.Condition(),
            config,
            channels=none,
            metadata=none,
            links=none,
            leaders=[BROKER],
            clock=self.clock,
            idempotence=self.idem,
        )
        self.outcomes: list[tuple[ProducerBatch, int, SluiceError | None]] = []

    def batches(self, n: int) -> list[ProducerBatch]:
        out = []
        for i in range(n):
            b = self.acc.roll(0)
            assert b.builder is not None
            b.builder.append(f"r{i}".encode(), None, None, None, 1_000)
            out.append(b)
        self.acc.close_open(0)
        return out

    def send_one(self) -> list[ProducerBatch]:
        """One request's worth, as the sender drains it (one batch: max_bytes=1 takes only the first)."""
        if 0 not in self.acc.ready(self.clock())[0]:
            return []
        run = self.acc.drain([0], max_bytes=1)
        for b in run:
            self.idem.stamp(b)
        return run

    def answer(
        self, batches: list[ProducerBatch], base_offset: int = -1, error: SluiceError | None = None
    ) -> None:
        """The broker's answer to the request that carried ``batches``, settled as the sender does."""
        part = broker_pb2.ProducePartitionResponse(topic="t", partition=0, base_offset=base_offset)
        if error is not None:
            part.error.CopyFrom(error.to_proto())
        answer = broker_pb2.ProduceResponse(partitions=[part])
        done: list[Any] = []
        self.sender._settle(BROKER, batches, answer, self.clock(), done)
        self.outcomes += [(b, offset, err) for b, offset, _, err in done]


def sequence(b: ProducerBatch) -> int:
    return b.producer[2]


def test_five_batches_fly_at_once_and_the_sixth_waits_for_an_answer() -> None:
    rig = Rig()
    bs = rig.batches(7)
    runs = [rig.send_one() for _ in range(6)]
    assert runs[:5] == [[b] for b in bs[:5]]
    assert runs[5] == []
    assert [sequence(b) for b in bs[:5]] == [0, 1, 2, 3, 4]
    assert rig.acc.in_flight_peak == 5
    rig.answer([bs[0]], base_offset=0)
    assert rig.send_one() == [bs[5]]
    assert sequence(bs[5]) == 5


def test_without_idempotence_one_run_flies_at_a_time() -> None:
    rig = Rig(max_in_flight=1)
    bs = rig.batches(3)
    assert rig.send_one() == [bs[0]]
    assert rig.send_one() == []
    assert rig.acc.in_flight(0) == [bs[0]]


def test_a_failed_batch_and_those_refused_behind_it_go_again_in_order_each_alone() -> None:
    rig = Rig()
    bs = rig.batches(7)
    for _ in range(5):
        rig.send_one()
    rig.answer([bs[0]], base_offset=100)
    rig.answer([bs[1]], error=NotEnoughReplicas("the ISR shrank"))
    # Blocked: bs[2..4] are still in flight, so nothing goes out, even past the backoff.
    rig.clock.advance(50)
    assert rig.send_one() == []
    for b in bs[2:5]:
        rig.answer([b], error=OutOfOrderSequence("expected sequence 1"))
    assert not rig.idem.needs_new_epoch  # an echo of bs[1]'s failure, not a gap
    assert [b for b, _, _ in rig.outcomes] == [bs[0]]  # nothing failed
    rig.clock.advance(50)
    resent = [rig.send_one() for _ in range(5)]
    assert resent == [[b] for b in bs[1:6]]  # in creation order, each alone, then the next new batch
    assert [sequence(b) for b in bs[1:6]] == [1, 2, 3, 4, 5]  # retries keep their sequences
    for n, b in enumerate(bs[1:6]):
        rig.answer([b], base_offset=101 + n)
    assert [offset for _, offset, _ in rig.outcomes] == [100, 101, 102, 103, 104, 105]
    assert all(err is None for _, _, err in rig.outcomes)


def test_a_leader_change_resends_every_batch_in_flight_in_order() -> None:
    rig = Rig()
    bs = rig.batches(5)
    for _ in range(5):
        rig.send_one()
    for b in bs:
        rig.answer([b], error=NotLeader("broker 1 no longer leads t/0"))
    assert rig.sender._need_metadata
    rig.clock.advance(50)
    assert [rig.send_one() for _ in range(6)] == [[b] for b in bs] + [[]]
    assert [sequence(b) for b in bs] == [0, 1, 2, 3, 4]


def test_a_real_gap_fails_the_oldest_batch_and_retries_the_rest_under_a_new_epoch() -> None:
    rig = Rig()
    bs = rig.batches(3)
    for _ in range(3):
        rig.send_one()
    rig.answer([bs[0]], error=OutOfOrderSequence("expected sequence 40"))
    assert rig.idem.needs_new_epoch
    assert [(b, type(err)) for b, _, err in rig.outcomes] == [(bs[0], OutOfOrderSequence)]
    rig.answer([bs[1]], error=OutOfOrderSequence("expected sequence 40"))
    rig.answer([bs[2]], error=OutOfOrderSequence("expected sequence 40"))
    assert len(rig.outcomes) == 1  # the batches behind it are not failed
    rig.idem.adopt(Identity(7, 1))
    rig.clock.advance(50)
    assert [rig.send_one() for _ in range(2)] == [[bs[1]], [bs[2]]]
    assert [b.producer for b in bs[1:]] == [(7, 1, 0), (7, 1, 1)]


def test_max_in_flight_is_bounded_by_what_the_broker_remembers() -> None:
    with pytest.raises(InvalidArgument, match="at most 5 with idempotence"):
        ProducerConfig().replace(max_in_flight=6)
    assert ProducerConfig().replace(max_in_flight=8, enable_idempotence=False).max_in_flight == 8


def test_a_batch_failing_for_good_with_later_ones_in_flight_holds_the_partition_for_a_new_epoch() -> None:
    rig = Rig()
    bs = rig.batches(4)
    for _ in range(3):
        rig.send_one()
    rig.answer([bs[0]], error=InvalidArgument("refused"))  # not retriable: bs[0] is never written
    assert rig.idem.needs_new_epoch
    rig.idem.adopt(Identity(7, 1))
    assert rig.send_one() == []  # held: bs[1] and bs[2] (old epoch) are still in flight
    rig.answer([bs[1]], error=OutOfOrderSequence("expected sequence 0"))
    rig.answer([bs[2]], error=OutOfOrderSequence("expected sequence 0"))
    assert [b for b, _, _ in rig.outcomes] == [bs[0]]
    rig.clock.advance(50)
    assert [rig.send_one() for _ in range(3)] == [[bs[1]], [bs[2]], [bs[3]]]
    assert [b.producer for b in bs[1:]] == [(7, 1, 0), (7, 1, 1), (7, 1, 2)]


def test_a_partial_batch_waits_for_the_answers_while_full_ones_pipeline() -> None:
    """Nagle's rule: under linger 0 a one-record batch does not take a request of its own while its
    partition has batches in flight; it goes (with whatever joined it meanwhile) when they are answered.
    Full batches still go up to max_in_flight."""
    rig = Rig()
    (first,) = rig.batches(1)
    assert rig.send_one() == [first]
    partial = rig.acc.roll(0)  # open: still taking records
    assert partial.builder is not None
    partial.builder.append(b"late", None, None, None, 1_000)
    rig.clock.advance(1000)  # far past any linger
    assert rig.send_one() == []
    partial.builder.append(b"later", None, None, None, 1_000)
    rig.answer([first], base_offset=0)
    (sent,) = rig.send_one()
    assert sent is partial
    assert sent.record_count == 2


def test_queued_full_batches_pipeline_behind_one_in_flight() -> None:
    rig = Rig()
    bs = rig.batches(3)  # closed (queued): full batches as far as the rule goes
    assert [rig.send_one() for _ in range(3)] == [[bs[0]], [bs[1]], [bs[2]]]
    assert rig.acc.in_flight(0) == bs
