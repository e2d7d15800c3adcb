"""ProducerConfig: typed defaults, converters, and rejection of unknown keys and bad values."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sluice.client.producer import ProducerConfig
from sluice.errors import InvalidArgument


def test_defaults() -> None:
    c = ProducerConfig()
    assert c.linger == timedelta(milliseconds=5)
    assert c.batch_size == 256 * 1024
    # Issue 14: acks="all" with idempotence is the default, as in Kafka 3.
    assert c.acks == -1
    assert c.idempotent
    assert c.retries == 5
    assert c.retry_backoff == timedelta(milliseconds=100)
    assert c.retry_backoff_max == timedelta(seconds=5)
    assert c.delivery_timeout == timedelta(seconds=120)
    assert c.buffer_memory == 64 * 1024 * 1024
    assert c.partitioner == "default"


def test_replace_converts_strings() -> None:
    c = ProducerConfig().replace(linger="20ms", batch_size="64KiB", delivery_timeout=3, acks=0)
    assert c.linger == timedelta(milliseconds=20)
    assert c.batch_size == 64 * 1024
    assert c.delivery_timeout == timedelta(seconds=3)
    assert c.acks == 0


def test_from_dict_and_env() -> None:
    assert ProducerConfig.from_dict({"retries": 9}).retries == 9
    env = {"SLUICE_PRODUCER_LINGER": "1s", "SLUICE_PRODUCER_PARTITIONER": "round_robin", "OTHER": "x"}
    c = ProducerConfig.from_env(env)
    assert c.linger == timedelta(seconds=1)
    assert c.partitioner == "round_robin"


def test_unknown_keys_rejected() -> None:
    with pytest.raises(InvalidArgument, match=r"unknown producer setting.*lingr"):
        ProducerConfig().replace(lingr="5ms")
    with pytest.raises(InvalidArgument, match="compression_type"):  # Kafka's name; ours is compression
        ProducerConfig.from_dict({"compression_type": "zstd"})


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("acks", 2, "acks must be 0, 1 or 'all'"),
        ("acks", "most", "acks"),
        ("retries", -1, "retries"),
        ("linger", "-5ms", "linger"),
        ("linger", "soon", "invalid duration"),
        ("batch_size", 10, "batch_size"),
        ("batch_size", True, "batch_size"),
        ("batch_size", 1.5, "batch_size"),
        ("max_request_size", 1024 * 1024 * 1024, "max_request_size"),
        ("delivery_timeout", 0, "delivery_timeout"),
        ("buffer_memory", 2048, "buffer_memory"),
        ("max_in_flight", 0, "max_in_flight"),
        ("partitioner", "murmur2", "unknown partitioner"),
        ("partitioner", 3, "partitioner"),
        ("retry_backoff", "10s", "retry_backoff_max must be >= retry_backoff"),
    ],
)
def test_bad_values_rejected(key: str, value: object, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        ProducerConfig().replace(**{key: value})


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(InvalidArgument, match="linger must be a timedelta"):
        ProducerConfig(linger=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="acks"):
        ProducerConfig(acks=-2)


def test_is_immutable_and_round_trips() -> None:
    c = ProducerConfig()
    with pytest.raises(AttributeError):
        c.acks = 0  # type: ignore[misc]
    assert ProducerConfig.from_dict(c.to_dict()) == c


def test_acks_all_and_idempotence_resolve_like_kafka() -> None:
    assert ProducerConfig(acks="all").acks == -1  # type: ignore[arg-type]  # "all" is accepted, as in Kafka
    assert ProducerConfig.from_dict({"acks": "all"}).acks == -1
    assert ProducerConfig.from_env({"SLUICE_PRODUCER_ACKS": "all"}).acks == -1
    assert ProducerConfig(acks=1).idempotent
    assert not ProducerConfig(acks=0).idempotent  # defaulted: off where no answer could tell a retry
    assert not ProducerConfig(enable_idempotence=False).idempotent
    with pytest.raises(InvalidArgument, match="enable_idempotence needs acks=1 or 'all'"):
        ProducerConfig(acks=0, enable_idempotence=True)
    with pytest.raises(InvalidArgument, match="acks must be 0, 1 or 'all'"):
        ProducerConfig(acks=2)
