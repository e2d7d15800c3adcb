"""kill -9 under flush=always: every acknowledged record survives, offsets stay dense."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from sluice.codec.batch import decode_records
from sluice.common.wire import FrameType
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import common_pb2
from tests.wire_v1_client import WireConnection

from .conftest import make_batch, running_broker, start_broker, vals

PARTITIONS = 2
PRODUCERS = 3


def test_acknowledged_produces_survive_kill_9(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    broker = start_broker(data_dir, flush="always")
    topic = "crash"
    broker.assign(topic, partitions=PARTITIONS)
    acked: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}  # partition -> offset -> value
    lock = threading.Lock()
    stop = threading.Event()

    def produce(worker: int) -> None:
        seq = 0
        while not stop.is_set():
            p = seq % PARTITIONS
            batch_values = [f"w{worker}-s{seq}-r{i}".encode() for i in range(5)]
            try:
                r = broker.produce(topic, p, make_batch(batch_values), acks=1)
            except grpc.RpcError:
                return  # the broker died under us: this one was never acknowledged
            if r.error.code == common_pb2.NONE:
                with lock:
                    for i, v in enumerate(batch_values):
                        acked[p][r.base_offset + i] = v
            seq += 1

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(PRODUCERS)]
    for t in threads:
        t.start()
    time.sleep(0.8)
    broker.kill()  # kill -9 mid-stream: no flush, no goodbye
    stop.set()
    for t in threads:
        t.join(10)
    broker.close()
    total = sum(len(v) for v in acked.values())
    assert total > 50, "the producers should have been acknowledged many times before the kill"

    _verify_recovered(data_dir, topic, acked)


def _verify_recovered(data_dir: Path, topic: str, acked: dict[int, dict[int, bytes]]) -> None:
    """Restarted on the same data: every acknowledged record is there, offsets are dense, no torn
    batch is visible, and appends continue after the recovered end."""
    with running_broker(data_dir, flush="always") as again:
        # Served again from its recorded assignment, without a new UpdatePartitions.
        for p in range(PARTITIONS):
            hwm = again.offsets(topic, -1, p).offset
            assert hwm >= max(acked[p]) + 1
            data = b""
            offset = 0
            while offset < hwm:
                resp = again.fetch_one(topic, offset, partition=p, max_bytes=1 << 20)
                assert resp.error.code == common_pb2.NONE
                data += resp.records
                offset = resp.next_offset
            # decode_records verifies every batch's CRC: a torn batch would fail here.
            got = decode_records(data, topic, p)
            assert [r.offset for r in got] == list(range(hwm)), "offsets must be dense from 0"
            by_offset = {r.offset: r.value for r in got}
            for off, value in acked[p].items():
                assert by_offset[off] == value
            # Appends continue densely after the recovered end.
            r = again.produce(topic, p, make_batch(vals(2)))
            assert r.error.code == common_pb2.NONE
            assert r.base_offset == hwm


def test_records_acknowledged_over_the_wire_survive_kill_9(tmp_path: Path) -> None:
    """The same guarantee on the SDK's data path: pipelined produces on wire connections."""
    data_dir = tmp_path / "data"
    broker = start_broker(data_dir, flush="always")
    topic = "crash-wire"
    broker.assign(topic, partitions=PARTITIONS)
    acked: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}
    lock = threading.Lock()
    conns: list[WireConnection[pb.ProduceRequest, pb.ProduceResponse]] = [
        WireConnection(broker.wire_address, FrameType.PRODUCE, pb.ProduceResponse, f"crash-{w}")
        for w in range(PRODUCERS)
    ]

    def settle(p: int, values: list[bytes]) -> Callable[[object], None]:
        def done(outcome: object) -> None:
            if isinstance(outcome, pb.ProduceResponse) and outcome.partitions:
                part = outcome.partitions[0]
                if part.error.code == common_pb2.NONE:
                    with lock:
                        for i, v in enumerate(values):
                            acked[p][part.base_offset + i] = v

        return done

    deadline = time.monotonic() + 0.8
    seq = 0
    while time.monotonic() < deadline:
        for w, conn in enumerate(conns):
            p = seq % PARTITIONS
            values = [f"w{w}-s{seq}-r{i}".encode() for i in range(5)]
            request = pb.ProduceRequest(acks=1, timeout_ms=5000)
            request.partitions.add(topic=topic, partition=p, records=make_batch(values))
            conn.send(request, 10, settle(p, values))
        seq += 1
        time.sleep(0.001)
    broker.kill()  # kill -9 with produces in flight on every connection
    for conn in conns:
        conn.close()
    broker.close()
    assert sum(len(v) for v in acked.values()) > 50, "produces should have been acknowledged before the kill"
    _verify_recovered(data_dir, topic, acked)
