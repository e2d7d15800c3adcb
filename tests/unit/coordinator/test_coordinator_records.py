"""Record codec, liveness sessions and configuration of the coordinator (pure, no network)."""

from __future__ import annotations

import argparse
import json
from datetime import timedelta

import pytest

from sluice.coordinator.cluster.model import Endpoint, TopicConfig
from sluice.coordinator.cluster.records import (
    BrokerRecord,
    ClusterRecord,
    TopicRecord,
    new_broker_record,
    new_cluster_record,
    new_dispatcher_record,
    new_topic_record,
    new_topic_tombstone,
)
from sluice.coordinator.cluster.sessions import Liveness, SessionTracker
from sluice.coordinator.config import ENV_PREFIX, CoordinatorConfig
from sluice.coordinator.records import Record, RecordCodec, Tombstone
from sluice.coordinator.state import CoordinatorState
from sluice.errors import InvalidArgument, StorageError
from sluice.server.config import add_arguments, load

CODEC = CoordinatorState().codec


@pytest.mark.parametrize(
    "record",
    [
        new_cluster_record(7, 3, 2),
        new_broker_record(1, Endpoint("b1.local", 7700), "inc-1", 3, 1_700_000_000_000),
        new_dispatcher_record("d-1", Endpoint("::1", 7800), "inc-2", 2, 1_700_000_000_001),
        new_topic_record("orders", "abc", [1, 2, 1], TopicConfig(retention_ms=1000, max_batch_bytes=5), 42),
        new_topic_record("plain", "def", [3], TopicConfig(), 43),
    ],
)
def test_records_round_trip_through_the_codec(record: Record) -> None:
    field, value = CODEC.encode(record)
    assert value is not None
    assert json.loads(value)["v"] == 1
    assert CODEC.decode(field, value) == record


def test_records_are_compact() -> None:
    _, value = CODEC.encode(
        new_topic_record("orders", "0123456789abcdef0123456789abcdef", [1, 2], TopicConfig(), 1)
    )
    assert value is not None
    assert len(value) < 120
    assert b" " not in value


def test_tombstones_encode_as_a_delete() -> None:
    assert CODEC.encode(new_topic_tombstone("orders")) == ("topic:orders", None)
    assert new_topic_tombstone("orders") == Tombstone(TopicRecord.TYPE, "orders")


def test_the_codec_refuses_what_it_cannot_read() -> None:
    with pytest.raises(StorageError, match="unknown type"):
        CODEC.decode("futuretype:g1", b'{"v":1}')
    with pytest.raises(StorageError, match="version 2"):
        CODEC.decode("cluster:metadata", b'{"v":2,"metadata_version":1}')
    with pytest.raises(StorageError, match="corrupt"):
        CODEC.decode("cluster:metadata", b"not json")
    with pytest.raises(StorageError, match="corrupt"):
        CODEC.decode("broker:1", b'{"v":1,"broker_id":1}')
    _, value = CODEC.encode(new_broker_record(1, Endpoint("h", 1), "i", 1, 1))
    assert value is not None
    with pytest.raises(StorageError, match="holds id"):
        CODEC.decode("broker:2", value)


def test_a_codec_rejects_duplicate_type_names() -> None:
    with pytest.raises(ValueError, match="duplicated"):
        RecordCodec([ClusterRecord, BrokerRecord, ClusterRecord])


# ---- sessions ----------------------------------------------------------------------------------


def test_sessions_are_bound_to_an_epoch_and_expire() -> None:
    s = SessionTracker[int](1_000)
    assert s.state(1, 1, 0) is Liveness.UNKNOWN
    assert s.touch(1, 1, 0) is True
    assert s.touch(1, 1, 500) is False  # already alive
    assert s.is_alive(1, 1, 1_400)
    assert not s.is_alive(1, 2, 1_400)  # another epoch's session does not count
    assert s.expire(1_501) == [1]
    assert s.state(1, 1, 1_501) is Liveness.EXPIRED
    assert s.expire(5_000) == []  # reported once
    assert s.touch(1, 1, 5_000) is True
    assert s.last_seen_ms(1) == 5_000


# ---- configuration ----------------------------------------------------------------------------------


def _config(argv: list[str], env: dict[str, str] | None = None) -> CoordinatorConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser, CoordinatorConfig)
    return load(CoordinatorConfig, ENV_PREFIX, parser.parse_args(argv), env=env or {}).validate()


def test_config_defaults_flags_and_env() -> None:
    config = _config(["--redis-url", "redis://127.0.0.1:1/0"])
    assert (config.port, config.metrics_port, config.key_prefix) == (7600, 9600, "sluice")
    assert config.broker_session_timeout == timedelta(seconds=10)
    assert config.broker_heartbeat_interval == timedelta(seconds=2)
    env = {"SLUICE_COORDINATOR_REDIS_URL": "redis://env/0", "SLUICE_COORDINATOR_BROKER_SESSION_TIMEOUT": "3s"}
    config = _config(["--port", "0", "--broker-heartbeat-interval", "500ms"], env)
    assert config.redis_url == "redis://env/0"
    assert config.port == 0
    assert config.cluster_settings().broker_session_timeout_ms == 3_000
    assert config.cluster_settings().broker_heartbeat_interval_ms == 500
    config = _config(["--redis-url", "redis://x", "--offset-store", "os.local:7700"])
    assert config.offset_store_endpoint() == Endpoint("os.local", 7700)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--redis-url"),
        (["--redis-url", "http://x"], "redis://"),
        (["--redis-url", "redis://x", "--port", "70000"], "--port"),
        (["--redis-url", "redis://x", "--broker-heartbeat-interval", "20s"], "shorter than"),
        (["--redis-url", "redis://x", "--offset-store", "nohostport"], "host:port"),
        (["--redis-url", "redis://x", "--broker-session-timeout", "soon"], "invalid duration"),
    ],
)
def test_config_rejects_bad_settings(argv: list[str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        _config(argv)
