"""Decompression bombs: a gzip-compressed gRPC message of zeros, far larger than the broker's 64 MiB
message limit once inflated, costs the broker no memory (docs/limits.md, "Decompression").

Record batches are inflated only within their declared size and the batch limit (docs/compression.md,
tests/unit/codec/test_compression.py); gRPC's own message compression is the other place a service could
inflate client bytes. gRPC inflates up to
``max_receive_message_length`` before refusing (measured: +70 MB peak for one 256 MiB bomb at a 64 MiB
limit, per concurrent stream); the services enable only the identity algorithm, which refuses the message
before inflating anything. bench/limits/decompression_bomb.py sends a 1 GiB one.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.codec.batch import encode_records
from sluice.errors import CorruptBatch, UnsupportedCompression
from tests.harness import ServiceProcess, run_redis, start_service

#: Zeros inflated: twice the broker's message limit, so a server that inflates would have to fill it.
BOMB_BYTES = 128 * 1024 * 1024


def _hwm_kb(sp: ServiceProcess) -> int:
    status = Path(f"/proc/{sp.process.pid}/status").read_text()
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    assert match, status
    return int(match.group(1))


@pytest.fixture(scope="module")
def coordinator_and_broker() -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    with run_redis() as redis, tempfile.TemporaryDirectory(prefix="sluice-bomb-") as d:
        coordinator = start_service(
            "coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url
        )
        try:
            broker = start_service(
                "broker",
                *("--port", "0", "--metrics-port", "0", "--data-dir", str(Path(d) / "b")),
                *("--broker-id", "1", "--coordinator", coordinator.address),
            )
            try:
                yield coordinator, broker
            finally:
                broker.terminate()
        finally:
            coordinator.terminate()


def test_a_gzip_bomb_on_produce_is_refused_without_inflating(
    coordinator_and_broker: tuple[ServiceProcess, ServiceProcess],
) -> None:
    _, broker = coordinator_and_broker
    before = _hwm_kb(broker)
    bomb: Any = bytes(BOMB_BYTES)
    options = [("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(broker.address, options=options, compression=grpc.Compression.Gzip) as ch:
        produce = ch.unary_unary("/sluice.v1.Broker/Produce", None, None)
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as info:
                produce(bomb, timeout=60)
            exc: Any = info.value
            assert exc.code() == grpc.StatusCode.UNIMPLEMENTED, exc.details()
            assert "gzip" in exc.details()
    del bomb
    grown_mb = (_hwm_kb(broker) - before) / 1024
    # An inflating server peaks at least 64 MiB higher (its message limit); this one holds nothing.
    assert grown_mb < 16, f"broker peak memory grew by {grown_mb:.0f} MB"
    with grpc.insecure_channel(broker.address) as ch:
        answer = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    assert "Traceback" not in broker.log()


def test_a_batch_claiming_compression_it_does_not_have_is_refused_typed() -> None:
    """Compressed batches are inflated only within their declared size (docs/compression.md; the bombs
    themselves: tests/unit/codec/test_compression.py): a plain body under a codec's bits is a corrupt
    frame, and bits that name no codec are UNSUPPORTED_COMPRESSION."""
    from sluice.codec.batch import CRC_AT, CRC_START, crc32c, validate_batch

    batch = bytearray(encode_records([(b"v", None, None, None, 1)]))
    batch[29] = 1  # attributes: gzip
    batch[CRC_AT : CRC_AT + 4] = crc32c(bytes(batch[CRC_START:])).to_bytes(4, "little")
    with pytest.raises(CorruptBatch, match=r"compressed batch at offset 0 declares|gzip payload"):
        validate_batch(bytes(batch), 0, 1 << 24)
    batch[29] = 0x40
    batch[CRC_AT : CRC_AT + 4] = crc32c(bytes(batch[CRC_START:])).to_bytes(4, "little")
    with pytest.raises(UnsupportedCompression, match="unsupported attributes 64"):
        validate_batch(bytes(batch), 0, 1 << 24)
