"""LogManager: one directory per partition, topic ids, reopen after restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.broker.log import LogConfig, LogManager
from sluice.errors import InvalidPartitions, InvalidTopic

from .helpers import Clock, make_batch, read_all, small_config


def test_create_is_idempotent_and_survives_a_restart(tmp_path: Path) -> None:
    mgr = LogManager(tmp_path, small_config())
    a0 = mgr.create("orders", "id-1", 0)
    a1 = mgr.create("orders", "id-1", 1)
    b0 = mgr.create("my-topic.v2", "id-2", 0)
    assert mgr.create("orders", "id-1", 0) is a0
    a0.append(make_batch(3))
    a1.append(make_batch(5))
    b0.append(make_batch(2))
    assert set(mgr.partitions()) == {("orders", 0), ("orders", 1), ("my-topic.v2", 0)}
    assert (tmp_path / "orders-0" / "partition.json").exists()
    mgr.close()

    restarted = LogManager(tmp_path, small_config())
    assert restarted.get("orders", 0) is None
    restarted.open_all()
    assert set(restarted.partitions()) == {("orders", 0), ("orders", 1), ("my-topic.v2", 0)}
    assert restarted.topic_id("orders", 1) == "id-1"
    assert restarted.topic_id("my-topic.v2", 0) == "id-2"
    assert restarted.topic_id("nope", 0) is None
    log = restarted.get("orders", 1)
    assert log is not None
    assert log.log_end_offset == 5
    # create() after open_all hands back the reopened log, data intact.
    assert restarted.create("orders", "id-1", 1) is log
    restarted.close()


def test_a_different_topic_id_means_the_old_data_is_from_a_deleted_topic(tmp_path: Path) -> None:
    mgr = LogManager(tmp_path, small_config())
    old = mgr.create("events", "old-id", 0)
    old.append(make_batch(10))
    fresh = mgr.create("events", "new-id", 0)
    assert fresh is not old
    assert (fresh.log_start_offset, fresh.log_end_offset) == (0, 0)
    assert mgr.topic_id("events", 0) == "new-id"
    fresh.append(make_batch(1))
    mgr.close()

    # Also when the stale data is only on disk (broker restarted after the topic was re-created).
    mgr = LogManager(tmp_path, small_config())
    newer = mgr.create("events", "newer-id", 0)
    assert newer.log_end_offset == 0
    assert mgr.topic_id("events", 0) == "newer-id"
    assert not any(p.name.startswith("~deleted") for p in tmp_path.iterdir())
    mgr.close()


def test_remove_deletes_the_data(tmp_path: Path) -> None:
    mgr = LogManager(tmp_path, small_config())
    mgr.create("t", "id", 0).append(make_batch(2))
    mgr.remove("t", 0)
    mgr.remove("t", 0)  # idempotent
    assert mgr.get("t", 0) is None
    assert not (tmp_path / "t-0").exists()
    mgr.open_all()
    assert mgr.partitions() == {}


def test_per_topic_config_is_kept_and_updated(tmp_path: Path) -> None:
    mgr = LogManager(tmp_path, small_config())
    custom = LogConfig(segment_bytes=700, retention_ms=-1, index_interval_bytes=100)
    log = mgr.create("t", "id", 0, custom)
    assert log.config == custom
    mgr.close()
    mgr = LogManager(tmp_path, small_config())
    mgr.open_all()
    log2 = mgr.get("t", 0)
    assert log2 is not None
    assert log2.config == custom
    changed = LogConfig(segment_bytes=900, retention_ms=-1)
    assert mgr.create("t", "id", 0, changed) is log2
    assert log2.config == changed
    mgr.close()
    mgr = LogManager(tmp_path, small_config())
    mgr.open_all()
    log3 = mgr.get("t", 0)
    assert log3 is not None
    assert log3.config == changed
    # None is authoritative too: the overrides are gone, the default applies, also after a restart.
    assert mgr.create("t", "id", 0, None) is log3
    assert log3.config == small_config()
    mgr.close()
    mgr = LogManager(tmp_path, small_config(segment_bytes=1234))
    mgr.open_all()
    log4 = mgr.get("t", 0)
    assert log4 is not None
    assert log4.config == small_config(segment_bytes=1234)
    mgr.close()


def test_flush_all_and_retention_all(tmp_path: Path) -> None:
    clock = Clock()
    mgr = LogManager(tmp_path, small_config(segment_bytes=600, retention_bytes=1000), clock)
    for p in range(3):
        log = mgr.create("t", "id", p)
        for i in range(10):
            log.append(make_batch(3, seed=i))
    mgr.flush_all()
    deleted = mgr.apply_retention_all()
    assert deleted > 0
    for log in mgr.partitions().values():
        assert log.log_start_offset > 0
        assert read_all(log)[-1].offset == 29
    mgr.close()


def test_bad_names_and_stray_directories(tmp_path: Path) -> None:
    mgr = LogManager(tmp_path, small_config())
    with pytest.raises(InvalidTopic):
        mgr.create("../etc", "id", 0)
    with pytest.raises(InvalidPartitions):
        mgr.create("t", "id", -1)
    (tmp_path / "not-a-partition").mkdir()
    (tmp_path / "~deleted-t-0-abcd").mkdir()
    (tmp_path / "some-file").write_text("x")
    (tmp_path / "broken-0").mkdir()
    (tmp_path / "broken-0" / "partition.json").write_text("{not json")
    mgr.open_all()
    assert mgr.partitions() == {}
    assert not (tmp_path / "~deleted-t-0-abcd").exists()
    assert (tmp_path / "not-a-partition").exists()  # not ours to delete
