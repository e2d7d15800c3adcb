"""The pure logic of the connection limits (docs/limits.md, "Connections"): the first-frame cap of
the frame reader, the settings' checks, gRPC's options and the clients' matching keepalive, and the
wire gate's counting and deadlines."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from sluice.common.rpc import CHANNEL_OPTIONS
from sluice.common.wire import HEADER, FrameReader, FrameTooLarge, FrameType
from sluice.errors import BrokerNotAvailable, InvalidArgument
from sluice.server.config import ConnectionSettings
from sluice.server.limits import CLOSE_REASONS, grpc_server_options
from sluice.server.wire_gate import ConnectionGate


def _frame(kind: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload) + 1, kind) + payload


def test_the_first_frame_is_held_to_its_own_cap_and_later_frames_to_the_frame_cap() -> None:
    reader = FrameReader(max_frame_bytes=1000, first_frame_bytes=100)
    # A hello that fits, and a larger frame after it in the same read: both pass.
    frames = reader.feed(_frame(FrameType.HELLO, b"h" * 50) + _frame(FrameType.PRODUCE, b"p" * 500))
    assert [(k, len(p)) for k, p in frames] == [(1, 50), (2, 500)]
    with pytest.raises(FrameTooLarge) as err:
        reader.feed(HEADER.pack(1001, FrameType.PRODUCE))
    assert not err.value.first


def test_a_first_frame_over_its_cap_is_refused_from_its_header_alone() -> None:
    reader = FrameReader(max_frame_bytes=64 << 20, first_frame_bytes=16 << 10)
    with pytest.raises(FrameTooLarge) as err:
        reader.feed(HEADER.pack(64 << 20, FrameType.HELLO))  # 5 bytes: nothing else buffered
    assert err.value.first
    assert "frames hold 1 to 16384 bytes before the hello" in err.value.message
    assert reader.buffered == 0


def test_the_first_frame_cap_holds_across_reads() -> None:
    reader = FrameReader(max_frame_bytes=1000, first_frame_bytes=100)
    assert reader.feed(HEADER.pack(50, FrameType.HELLO)[:3]) == []
    assert reader.feed(HEADER.pack(50, FrameType.HELLO)[3:] + b"x" * 49) == [(1, b"x" * 49)]
    assert reader.feed(_frame(FrameType.PRODUCE, b"y" * 900)) == [(2, b"y" * 900)]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_connections", 0),
        ("max_connections_per_address", 0),
        ("max_hello_bytes", 0),
        ("grpc_max_concurrent_streams", 0),
        ("max_frame_bytes", 8),
        ("keepalive_max_ping_strikes", -1),
        ("hello_timeout", timedelta(0)),
        ("connections_max_idle", timedelta(seconds=-1)),
    ],
)
def test_settings_no_listener_can_run_with_are_refused(name: str, value: Any) -> None:
    settings = dataclasses.replace(ConnectionSettings(), **{name: value})
    with pytest.raises(InvalidArgument, match=name):
        settings.check_connection_settings()


def test_the_defaults_are_valid_and_the_grpc_options_carry_them() -> None:
    settings = ConnectionSettings()
    settings.check_connection_settings()
    options = dict(grpc_server_options(settings))
    assert options["grpc.max_concurrent_streams"] == 4096
    assert options["grpc.max_receive_message_length"] == 64 << 20
    assert options["grpc.max_metadata_size"] == options["grpc.absolute_max_metadata_size"] == 16 << 10
    assert options["grpc.max_connection_idle_ms"] == 600_000
    assert options["grpc.keepalive_permit_without_calls"] == 1
    assert options["grpc.http2.max_ping_strikes"] == 2


def test_the_clients_keepalive_stays_clear_of_the_servers_ping_policing() -> None:
    client = dict(CHANNEL_OPTIONS)
    server = dict(grpc_server_options(ConnectionSettings()))
    # A client pinging closer together than the server allows would be sent away (GOAWAY
    # too_many_pings); twice the minimum leaves room for timer jitter.
    assert client["grpc.keepalive_time_ms"] >= 2 * server["grpc.http2.min_ping_interval_without_data_ms"]
    assert client["grpc.keepalive_permit_without_calls"] == server["grpc.keepalive_permit_without_calls"] == 1


class _Conn:
    def __init__(self, host: str, due: str | None = None) -> None:
        self.host = host
        self.due = due
        self.dropped: list[str] = []

    def overdue(self, now: float, limits: ConnectionSettings) -> str | None:
        return self.due

    def drop(self, reason: str) -> None:
        self.dropped.append(reason)


def test_the_gate_counts_per_address_and_in_total() -> None:
    gate: ConnectionGate[_Conn] = ConnectionGate(
        "unit", dataclasses.replace(ConnectionSettings(), max_connections=3, max_connections_per_address=2)
    )
    a1, a2, a3, b1, c1 = _Conn("a"), _Conn("a"), _Conn("a"), _Conn("b"), _Conn("c")
    assert gate.admit(a1) is None
    assert gate.admit(a2) is None
    refused = gate.admit(a3)
    assert isinstance(refused, BrokerNotAvailable)
    assert "max_connections_per_address" in refused.message
    assert gate.admit(b1) is None
    refused = gate.admit(c1)
    assert isinstance(refused, BrokerNotAvailable)
    assert "(3, max_connections)" in refused.message
    gate.release(a1)
    assert gate.per_host == {"a": 1, "b": 1}
    assert gate.admit(a3) is None
    gate.release(a2)
    gate.release(a3)
    assert gate.per_host == {"b": 1}


def test_the_patrol_drops_what_is_overdue_and_runs_often_enough() -> None:
    settings = dataclasses.replace(ConnectionSettings(), hello_timeout=timedelta(seconds=2))
    gate: ConnectionGate[_Conn] = ConnectionGate("unit2", settings)
    late, fine = _Conn("a", "idle"), _Conn("a")
    gate.admit(late)
    gate.admit(fine)
    gate.patrol_once(0.0)
    assert late.dropped == ["idle"]
    assert fine.dropped == []
    assert gate.patrol_interval() == 0.5  # a quarter of the shortest deadline
    assert ConnectionGate("unit3", ConnectionSettings()).patrol_interval() == 1.0
    assert "idle" in CLOSE_REASONS
