"""ResetOffsets to earliest / latest / a timestamp, resolved through a real coordinator and broker."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import grpc
import pytest
import redis

from sluice.client.rpc import call
from sluice.codec.batch import BatchBuilder
from sluice.errors import GroupNotEmpty, InvalidArgument, UnknownGroup, UnknownTopicOrPartition
from sluice.v1 import (
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    offset_store_pb2,
    offset_store_pb2_grpc,
)
from tests.harness import ServiceProcess, run_redis, start_service

BASE_TIMESTAMP = 1_000_000


@pytest.fixture(scope="module")
def offset_store() -> Iterator[tuple[offset_store_pb2_grpc.OffsetStoreStub, str]]:
    """An offset store configured with a coordinator, and a broker holding topic ``t``:
    partition 0 has records 0..4 stamped BASE_TIMESTAMP + 0..4, partition 1 is empty."""
    services: list[ServiceProcess] = []
    channels: list[grpc.Channel] = []
    with run_redis() as redis_server, tempfile.TemporaryDirectory() as data_dir:
        try:
            common = ("--port", "0", "--metrics-port", "0")
            coordinator = start_service("coordinator", *common, "--redis-url", redis_server.url)
            services.append(coordinator)
            broker = start_service(
                "broker", *common, "--data-dir", data_dir, "--coordinator", coordinator.address
            )
            services.append(broker)
            store = start_service(
                "offset-store", *common, "--redis-url", redis_server.url, "--coordinator", coordinator.address
            )
            services.append(store)
            channels += [grpc.insecure_channel(s.address) for s in services]
            create = coordinator_pb2.CreateTopicRequest(name="t", partitions=2)
            call(coordinator_pb2_grpc.CoordinatorStub(channels[0]).CreateTopic, create, timeout=10)
            batch = BatchBuilder()
            for i in range(5):
                batch.append(b"v", None, None, None, BASE_TIMESTAMP + i)
            produce = broker_pb2.ProduceRequest(acks=1, timeout_ms=5000)
            produce.partitions.add(topic="t", partition=0, records=batch.build())
            response = call(broker_pb2_grpc.BrokerStub(channels[1]).Produce, produce, timeout=10)
            assert response.partitions[0].error.code == common_pb2.NONE, response
            yield offset_store_pb2_grpc.OffsetStoreStub(channels[2]), redis_server.url
        finally:
            for channel in channels:
                channel.close()
            for service in reversed(services):
                service.terminate()


def reset(
    stub: offset_store_pb2_grpc.OffsetStoreStub, spec: int, value: int = 0, partitions: tuple[int, ...] = ()
) -> dict[int, int]:
    request = offset_store_pb2.ResetOffsetsRequest(group="g", topic="t", partitions=partitions, value=value)
    request.spec = spec  # type: ignore[assignment]
    return {o.partition: o.offset for o in call(stub.ResetOffsets, request, timeout=10).offsets}


def test_earliest_latest_and_timestamp_of_every_partition(
    offset_store: tuple[offset_store_pb2_grpc.OffsetStoreStub, str],
) -> None:
    stub, _ = offset_store
    assert reset(stub, offset_store_pb2.RESET_SPEC_LATEST) == {0: 5, 1: 0}
    assert reset(stub, offset_store_pb2.RESET_SPEC_EARLIEST) == {0: 0, 1: 0}
    assert reset(stub, offset_store_pb2.RESET_SPEC_TIMESTAMP, BASE_TIMESTAMP + 3, (0,)) == {0: 3}
    fetched = call(stub.FetchOffsets, offset_store_pb2.FetchOffsetsRequest(group="g"), timeout=10)
    assert {o.partition: o.offset for o in fetched.offsets} == {0: 3, 1: 0}
    # With a coordinator, empty partitions means every partition of the topic; partition 1 is empty,
    # so offset 4 is past its log end and clamped to it.
    assert reset(stub, offset_store_pb2.RESET_SPEC_OFFSET, 4) == {0: 4, 1: 0}


def committed(stub: offset_store_pb2_grpc.OffsetStoreStub, group: str = "g") -> dict[int, int]:
    fetched = call(stub.FetchOffsets, offset_store_pb2.FetchOffsetsRequest(group=group), timeout=10)
    return {o.partition: o.offset for o in fetched.offsets}


def test_a_preview_changes_nothing_and_execute_applies_the_same_plan(
    offset_store: tuple[offset_store_pb2_grpc.OffsetStoreStub, str],
) -> None:
    stub, _ = offset_store
    reset(stub, offset_store_pb2.RESET_SPEC_OFFSET, 3, (0,))
    reset(stub, offset_store_pb2.RESET_SPEC_OFFSET, 0, (1,))
    shift = offset_store_pb2.ResetOffsetsRequest(
        group="g", spec=offset_store_pb2.RESET_SPEC_SHIFT, value=10, all_topics=True, dry_run=True
    )
    preview = call(stub.ResetOffsets, shift, timeout=10)
    rows = {(o.topic, o.partition): (o.previous, o.offset, o.clamped) for o in preview.outcomes}
    assert rows == {("t", 0): (3, 5, "log_end"), ("t", 1): (0, 0, "log_end")}
    assert [(o.log_start_offset, o.log_end_offset) for o in preview.outcomes] == [(0, 5), (0, 0)]
    assert committed(stub) == {0: 3, 1: 0}  # a preview writes nothing

    back = offset_store_pb2.ResetOffsetsRequest(
        group="g",
        spec=offset_store_pb2.RESET_SPEC_SHIFT,
        value=-2,
        topics=[offset_store_pb2.ResetTopic(topic="t")],
    )
    done = call(stub.ResetOffsets, back, timeout=10)
    assert [(o.previous, o.offset, o.clamped) for o in done.outcomes] == [(3, 1, ""), (0, 0, "log_start")]
    assert committed(stub) == {0: 1, 1: 0}


def test_a_reset_to_a_future_time_and_a_shift_without_offsets_are_refused(
    offset_store: tuple[offset_store_pb2_grpc.OffsetStoreStub, str],
) -> None:
    stub, _ = offset_store
    future = offset_store_pb2.ResetOffsetsRequest(
        group="g", topic="t", spec=offset_store_pb2.RESET_SPEC_TIMESTAMP, value=2**62, dry_run=True
    )
    with pytest.raises(InvalidArgument, match="in the future"):
        call(stub.ResetOffsets, future, timeout=10)
    shift = offset_store_pb2.ResetOffsetsRequest(
        group="never-committed", topic="t", spec=offset_store_pb2.RESET_SPEC_SHIFT, value=1
    )
    with pytest.raises(InvalidArgument, match="without a committed offset: t/0, t/1"):
        call(stub.ResetOffsets, shift, timeout=10)
    everything = offset_store_pb2.ResetOffsetsRequest(
        group="never-committed", spec=offset_store_pb2.RESET_SPEC_EARLIEST, all_topics=True
    )
    with pytest.raises(UnknownGroup, match="no committed offsets"):
        call(stub.ResetOffsets, everything, timeout=10)


def test_unknown_topic_or_partition(offset_store: tuple[offset_store_pb2_grpc.OffsetStoreStub, str]) -> None:
    stub, _ = offset_store
    with pytest.raises(UnknownTopicOrPartition, match="no partition 7"):
        reset(stub, offset_store_pb2.RESET_SPEC_EARLIEST, partitions=(7,))
    request = offset_store_pb2.ResetOffsetsRequest(group="g", topic="missing")
    request.spec = offset_store_pb2.RESET_SPEC_LATEST
    with pytest.raises(UnknownTopicOrPartition, match="'missing' does not exist"):
        call(stub.ResetOffsets, request, timeout=10)


def test_live_group_is_refused_before_asking_brokers(
    offset_store: tuple[offset_store_pb2_grpc.OffsetStoreStub, str],
) -> None:
    stub, url = offset_store
    with redis.Redis.from_url(url) as r:
        r.set("sluice:grp:{g}:live", 1)
        try:
            with pytest.raises(GroupNotEmpty):
                reset(stub, offset_store_pb2.RESET_SPEC_LATEST)
        finally:
            r.delete("sluice:grp:{g}:live")
