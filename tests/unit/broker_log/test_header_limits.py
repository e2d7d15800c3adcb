"""Record header limits apply to a produced batch only: a follower copies what its leader accepted (a
follower configured with lower limits must not stall replication), and recovery reads what was written."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sluice.broker.log import PartitionLog
from sluice.codec.batch import encode_records
from sluice.errors import LimitExceeded

from .helpers import Clock, abandon, read_all, small_config

HEADERS = {f"h{i}": b"v" for i in range(5)}


def _log(path: Path, max_headers: int) -> PartitionLog:
    config = dataclasses.replace(small_config(), max_record_headers=max_headers)
    return PartitionLog(path, config, Clock())


def test_produce_is_refused_over_the_limit_but_a_follower_copies_what_its_leader_took(tmp_path: Path) -> None:
    batch = encode_records([(b"v", None, None, HEADERS, 1)])
    strict = _log(tmp_path / "strict", max_headers=4)
    with pytest.raises(LimitExceeded, match="max_record_headers=4"):
        strict.append(batch, leader_epoch=0)
    assert strict.log_end_offset == 0
    leader = _log(tmp_path / "leader", max_headers=10)
    leader.append(batch, leader_epoch=0)
    strict.append_replicated(leader.read(0, 1 << 16).data)
    assert [r.headers for r in read_all(strict)] == [HEADERS]
    abandon(strict)  # no clean shutdown: reopening recovers, validating every batch without the limits
    reopened = _log(tmp_path / "strict", max_headers=1)
    assert [r.headers for r in read_all(reopened)] == [HEADERS]
    reopened.close()
    leader.close()
