"""The broker's produce memory budget (docs/memory.md, "Broker") against a real broker process.

Sixteen wire clients each trickle 4 MiB produce frames, as slow links do: without a budget the
broker would hold every half-received frame at once (16 x 4 MiB). With an 8 MiB budget it
reserves a frame's size when its length arrives, and stops reading the connections it cannot
grant, so at most two frames are held while the rest wait in the kernel's socket buffers. Every
frame is still answered without error, and every acknowledged record is in the log once.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from sluice.common.wire import HEADER, FrameType
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import common_pb2
from tests.wire_client import RawWire

from .conftest import make_batch, records, running_broker

MiB = 1 << 20
CLIENTS = 16
FRAMES = 2
RECORDS = 64  # per frame, 64 KiB each: a 4 MiB frame
BUDGET = 8 * MiB
CHUNK = 256 * 1024


def _rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def _client(address: str, topic: str, n: int, answers: list[pb.ProduceResponse], errors: list[str]) -> None:
    try:
        wire = RawWire(address)
        wire.sock.settimeout(120)
        try:
            wire.hello()
            for f in range(FRAMES):
                values = [f"c{n}-f{f}-r{i}-".encode().ljust(64 * 1024, b".") for i in range(RECORDS)]
                request = pb.ProduceRequest(acks=1, timeout_ms=30_000, request_id=f)
                request.partitions.add(topic=topic, partition=0, records=make_batch(values))
                payload = request.SerializeToString()
                data = HEADER.pack(len(payload) + 1, FrameType.PRODUCE) + payload
                for at in range(0, len(data), CHUNK):  # a slow link: the frame arrives over ~0.3 s
                    wire.sock.sendall(data[at : at + CHUNK])
                    time.sleep(0.02)
                answers.append(pb.ProduceResponse.FromString(wire.answer(FrameType.PRODUCE)))
        finally:
            wire.close()
    except Exception as exc:  # reported by the test
        errors.append(repr(exc))


def test_trickled_big_frames_stay_within_the_produce_budget(tmp_path: Path) -> None:
    with running_broker(tmp_path / "b", "--produce-memory-bytes", str(BUDGET)) as broker:
        topic = "budget"
        broker.assign(topic)
        pid = broker.proc.process.pid
        baseline = _rss_kib(pid, "VmRSS")
        answers: list[pb.ProduceResponse] = []
        errors: list[str] = []
        threads = [
            threading.Thread(target=_client, args=(broker.wire_address, topic, n, answers, errors))
            for n in range(CLIENTS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert not errors, errors
        assert len(answers) == CLIENTS * FRAMES
        assert all(a.error.code == common_pb2.NONE for a in answers), answers
        assert all(p.error.code == common_pb2.NONE for a in answers for p in a.partitions)

        peak = broker.metric("sluice_broker_memory_peak_bytes", pool="produce")
        paused = broker.metric("sluice_broker_memory_paused_total", pool="produce")
        used = broker.metric("sluice_broker_memory_used_bytes", pool="produce")
        assert peak is not None
        assert 4 * MiB <= peak <= BUDGET, peak
        assert paused is not None
        assert paused > 0, "the budget never held a connection back"
        assert used == 0, used  # every reservation was given back
        grown_mib = (_rss_kib(pid, "VmHWM") - baseline) / 1024
        print(f"produce budget {BUDGET >> 20} MiB: peak held {peak / MiB:.1f} MiB, RSS +{grown_mib:.1f} MiB")
        # 16 frames held at once would be 64 MiB; two reserved frames, the frame being appended
        # (its copies) and one read buffer per paused connection stay well below 48 MiB.
        assert grown_mib < 48, f"broker RSS peaked {grown_mib:.1f} MiB above its baseline"
        # After the churn the pool, empty again, has the heap's free pages returned (malloc_trim).
        deadline = time.monotonic() + 15
        while (after_mib := (_rss_kib(pid, "VmRSS") - baseline) / 1024) >= 8 and time.monotonic() < deadline:
            time.sleep(0.2)
        print(f"RSS after churn +{after_mib:.1f} MiB")
        assert after_mib < 8, f"RSS stayed {after_mib:.1f} MiB above its baseline after the churn"

        # Nothing acknowledged is lost or doubled: every record is in the log once.
        seen: list[bytes] = []
        offset = 0
        deadline = time.monotonic() + 60
        while len(seen) < CLIENTS * FRAMES * RECORDS and time.monotonic() < deadline:
            answer = broker.fetch(
                pb.FetchPartition(topic=topic, partition=0, fetch_offset=offset, partition_max_bytes=8 * MiB),
                max_bytes=8 * MiB,
            )
            got = records(answer.partitions[0], offset)
            if not got:
                break
            seen += [r.value.rstrip(b".").removesuffix(b"-") for r in got]
            offset = got[-1].offset + 1
        want = {
            f"c{n}-f{f}-r{i}".encode() for n in range(CLIENTS) for f in range(FRAMES) for i in range(RECORDS)
        }
        assert len(seen) == len(want)
        assert set(seen) == want
        assert broker.metric("sluice_broker_memory_limit_bytes", pool="produce") == BUDGET


def test_grpc_produces_waiting_for_their_fsync_hold_at_most_the_budget(tmp_path: Path) -> None:
    """flush=always: a unary Produce holds its request until its group commit answers it. Twelve
    producers of 2 MiB batches against a 4 MiB budget: the handlers beyond it wait before appending
    (back-pressure, not errors), and every record is in the log once."""
    producers, batches, per_batch = 12, 3, 32  # 32 x 64 KiB: 2 MiB per request
    budget = 4 * MiB + 64 * 1024  # two requests with their headers
    with running_broker(tmp_path / "b", "--produce-memory-bytes", str(budget), flush="always") as broker:
        topic = "grpc-budget"
        broker.assign(topic)
        errors: list[str] = []

        def produce(n: int) -> None:
            try:
                for b in range(batches):
                    values = [f"p{n}-b{b}-r{i}-".encode().ljust(64 * 1024, b".") for i in range(per_batch)]
                    request = pb.ProduceRequest(acks=1, timeout_ms=60_000)
                    request.partitions.add(topic=topic, partition=0, records=make_batch(values))
                    answer = broker.stub.Produce(request, timeout=120)
                    if answer.partitions[0].error.code != common_pb2.NONE:
                        errors.append(str(answer.partitions[0].error))
            except Exception as exc:  # reported by the test
                errors.append(repr(exc))

        threads = [threading.Thread(target=produce, args=(n,)) for n in range(producers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert not errors, errors
        peak = broker.metric("sluice_broker_memory_peak_bytes", pool="produce")
        assert peak is not None
        assert 2 * MiB <= peak <= budget, peak
        paused = broker.metric("sluice_broker_memory_paused_total", pool="produce")
        print(f"gRPC produce budget {budget / MiB:.2f} MiB: peak held {peak / MiB:.1f} MiB, waited {paused}")
        assert paused is not None
        assert paused > 0, "no handler ever waited: the budget was never reached"
        assert broker.metric("sluice_broker_memory_used_bytes", pool="produce") == 0
        seen: list[bytes] = []
        offset = 0
        deadline = time.monotonic() + 60
        while len(seen) < producers * batches * per_batch and time.monotonic() < deadline:
            answer = broker.fetch(
                pb.FetchPartition(topic=topic, partition=0, fetch_offset=offset, partition_max_bytes=8 * MiB),
                max_bytes=8 * MiB,
            )
            got = records(answer.partitions[0], offset)
            if not got:
                break
            seen += [r.value.rstrip(b".").removesuffix(b"-") for r in got]
            offset = got[-1].offset + 1
        want = {
            f"p{n}-b{b}-r{i}".encode()
            for n in range(producers)
            for b in range(batches)
            for i in range(per_batch)
        }
        assert len(seen) == len(want)
        assert set(seen) == want


def test_a_request_larger_than_the_whole_budget_is_served_alone(tmp_path: Path) -> None:
    """No deadlock and no refusal: a 4 MiB frame (trickled) and a 2 MiB gRPC request against a
    1 MiB produce budget are each granted once the pool is empty, and answered."""
    with running_broker(tmp_path / "b", "--produce-memory-bytes", str(MiB)) as broker:
        topic = "larger"
        broker.assign(topic)
        answers: list[pb.ProduceResponse] = []
        errors: list[str] = []
        wire = threading.Thread(target=_client, args=(broker.wire_address, topic, 0, answers, errors))
        wire.start()
        values = [f"g-{i}-".encode().ljust(64 * 1024, b".") for i in range(32)]
        request = pb.ProduceRequest(acks=1, timeout_ms=30_000)
        request.partitions.add(topic=topic, partition=0, records=make_batch(values))
        grpc_answer = broker.stub.Produce(request, timeout=120)
        wire.join(120)
        assert not errors, errors
        assert grpc_answer.partitions[0].error.code == common_pb2.NONE
        assert [a.partitions[0].error.code for a in answers] == [common_pb2.NONE] * FRAMES
        peak = broker.metric("sluice_broker_memory_peak_bytes", pool="produce")
        assert peak is not None
        assert peak > MiB  # granted alone, beyond the budget
        assert broker.metric("sluice_broker_memory_used_bytes", pool="produce") == 0
        offsets = broker.offsets(topic, -1)
        assert offsets.offset == FRAMES * RECORDS + len(values)


def _fetch_request(topic: str, max_bytes: int) -> pb.FetchRequest:
    return pb.FetchRequest(
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=max_bytes,
        partitions=[
            pb.FetchPartition(topic=topic, partition=0, fetch_offset=0, partition_max_bytes=max_bytes)
        ],
    )


def test_fetch_answers_clients_do_not_read_hold_at_most_the_fetch_budget(tmp_path: Path) -> None:
    """Six wire clients ask for 16 MiB each and do not read: an answer the socket cannot take
    stays in the broker (the transport's buffer) and holds the fetch pool, so with a 32 MiB
    budget the broker assembles at most two of them and the others wait. Once the clients read,
    every one gets its whole answer."""
    clients, answer_bytes, budget = 6, 16 * MiB, 32 * MiB
    with running_broker(tmp_path / "b", "--fetch-memory-bytes", str(budget)) as broker:
        topic = "fetch-budget"
        broker.assign(topic)
        for b in range(5):  # 20 MiB of log: each answer is full
            values = [f"b{b}-{i}-".encode().ljust(64 * 1024, b".") for i in range(64)]
            request = pb.ProduceRequest(acks=1, timeout_ms=30_000)
            request.partitions.add(topic=topic, partition=0, records=make_batch(values))
            assert broker.stub.Produce(request, timeout=60).partitions[0].error.code == common_pb2.NONE
        pid = broker.proc.process.pid
        baseline = _rss_kib(pid, "VmRSS")
        conns = [RawWire(broker.wire_address) for _ in range(clients)]
        try:
            for conn in conns:
                conn.sock.settimeout(60)
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
                conn.hello()
                conn.fetch(_fetch_request(topic, answer_bytes))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # until the pool is full and the rest wait
                paused = broker.metric("sluice_broker_memory_paused_total", pool="fetch") or 0
                if paused >= 1:
                    break
                time.sleep(0.1)
            held = broker.metric("sluice_broker_memory_used_bytes", pool="fetch")
            grown_mib = (_rss_kib(pid, "VmRSS") - baseline) / 1024
            print(f"fetch budget {budget >> 20} MiB: {held} held, RSS +{grown_mib:.1f} MiB, waits {paused}")
            assert paused >= 1, "every answer was assembled although nobody read"
            assert held is not None
            assert held <= budget + answer_bytes
            for conn in conns:  # now they read: each gets its whole answer
                answer = pb.FetchResponse.FromString(conn.answer(FrameType.FETCH))
                assert answer.partitions[0].error.code == common_pb2.NONE
                # Whole 4 MiB batches up to 16 MiB: three of them, each client the same.
                assert [r.offset for r in records(answer.partitions[0])] == list(range(3 * 64))
        finally:
            for conn in conns:
                conn.close()
        peak = broker.metric("sluice_broker_memory_peak_bytes", pool="fetch")
        assert peak is not None
        assert peak <= budget + answer_bytes
