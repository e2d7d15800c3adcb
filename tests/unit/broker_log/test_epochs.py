"""Leader epochs in the log: the epoch cache and its checkpoint, OffsetForLeaderEpoch answers,
truncation, and the divergence cases of KIP-101 and KIP-279 between two real logs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.broker.log import PartitionLog
from sluice.broker.log.epochs import CHECKPOINT_FILE, LeaderEpochCache
from sluice.broker.log.truncation import divergence_offset
from sluice.codec.batch import iter_headers
from sluice.errors import CorruptBatch, InvalidArgument, NotLeader

from .helpers import Clock, abandon, make_batch, read_all, segment_files, small_config


def _open(path: Path, clock: Clock | None = None) -> PartitionLog:
    return PartitionLog(path, small_config(), clock or Clock())


def _log_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in segment_files(path))


def _append(log: PartitionLog, epoch: int, batches: int, seed: int) -> None:
    for i in range(batches):
        log.append(make_batch(3, seed=seed * 1000 + i), leader_epoch=epoch)


def _replicate(follower: PartitionLog, leader: PartitionLog) -> None:
    """The follower fetches everything it lacks from the leader and appends it byte for byte."""
    for _ in range(10_000):
        if follower.log_end_offset >= leader.log_end_offset:
            return
        res = leader.read(follower.log_end_offset, 1 << 16)
        follower.append_replicated(res.data)
    raise AssertionError("replication made no progress")


def _become_follower(follower: PartitionLog, leader: PartitionLog) -> int:
    point = divergence_offset(follower, leader.end_offset_for_epoch)
    if point < 0:
        follower.truncate_fully_and_start_at(leader.log_start_offset)
    else:
        follower.truncate_to(point)
    _replicate(follower, leader)
    return point


# ---- the cache ------------------------------------------------------------------------------


def test_end_offset_for_epoch_follows_kafka(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path)
    assert cache.end_offset_for(0, 10) == (-1, -1)  # empty
    for epoch, start in ((1, 0), (3, 10), (4, 25)):
        cache.assign(epoch, start)
    leo = 40
    assert cache.end_offset_for(4, leo) == (4, leo)  # the latest epoch ends at the log end
    assert cache.end_offset_for(3, leo) == (3, 25)  # ends where the next one starts
    assert cache.end_offset_for(2, leo) == (1, 10)  # unknown epoch: the largest below it
    assert cache.end_offset_for(0, leo) == (0, 0)  # below the first: its start (Kafka)
    assert cache.end_offset_for(5, leo) == (-1, -1)  # above the latest
    assert cache.end_offset_for(-1, leo) == (-1, -1)


def test_assign_keeps_epochs_and_starts_strictly_increasing(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path)
    assert cache.assign(1, 0)
    assert not cache.assign(1, 5)  # same epoch, later offset: nothing new
    assert cache.assign(2, 5)
    assert cache.assign(3, 5)  # elected again before any append: only the later stays
    assert cache.entries() == [(1, 0), (3, 5)]
    assert cache.assign(2, 3)  # a lower epoch at a lower offset replaces what is not below it
    assert cache.entries() == [(1, 0), (2, 3)]
    assert not LeaderEpochCache(tmp_path).load()  # an append's change waits for the log's flush
    cache.persist()
    reloaded = LeaderEpochCache(tmp_path)
    assert reloaded.load()
    assert reloaded.entries() == [(1, 0), (2, 3)]


def test_the_checkpoint_detects_a_flipped_bit_anywhere(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path)
    cache.assign(1, 0)
    cache.assign(7, 100)
    cache.persist()
    raw = (tmp_path / CHECKPOINT_FILE).read_bytes()
    for i in range(len(raw)):
        for bit in (0, 7):
            bad = bytearray(raw)
            bad[i] ^= 1 << bit
            (tmp_path / CHECKPOINT_FILE).write_bytes(bytes(bad))
            assert not LeaderEpochCache(tmp_path).load(), (i, bit)
    (tmp_path / CHECKPOINT_FILE).write_bytes(raw[:-1])
    assert not LeaderEpochCache(tmp_path).load()


# ---- in the log -----------------------------------------------------------------------------


def test_appends_stamp_the_epoch_and_the_cache_follows(tmp_path: Path) -> None:
    log = _open(tmp_path / "p")
    _append(log, 0, 3, seed=1)
    _append(log, 2, 2, seed=2)
    _append(log, 5, 4, seed=3)
    assert log.epoch_entries() == [(0, 0), (2, 9), (5, 15)]
    epochs = [h.partition_leader_epoch for _, h in iter_headers(_log_bytes(tmp_path / "p"))]
    assert epochs == [0] * 3 + [2] * 2 + [5] * 4
    with pytest.raises(NotLeader, match="older than the log's latest epoch 5"):
        log.append(make_batch(1), leader_epoch=4)
    with pytest.raises(InvalidArgument, match="leader_epoch must be >= 0"):
        log.append(make_batch(1), leader_epoch=-1)
    assert log.log_end_offset == 27
    assert log.end_offset_for_epoch(2) == (2, 15)
    assert log.end_offset_for_epoch(5) == (5, 27)
    log.close()
    reopened = _open(tmp_path / "p")
    assert reopened.epoch_entries() == [(0, 0), (2, 9), (5, 15)]
    reopened.close()


@pytest.mark.parametrize("damage", ["missing", "flipped", "garbage"])
def test_a_missing_or_corrupt_checkpoint_is_rebuilt_from_the_batches(tmp_path: Path, damage: str) -> None:
    log = _open(tmp_path / "p")
    _append(log, 1, 20, seed=1)  # several segments
    _append(log, 4, 20, seed=2)
    expected = log.epoch_entries()
    log.close()
    assert len(segment_files(tmp_path / "p")) > 1
    checkpoint = tmp_path / "p" / CHECKPOINT_FILE
    if damage == "missing":
        checkpoint.unlink()
    elif damage == "flipped":
        raw = bytearray(checkpoint.read_bytes())
        raw[13] ^= 0x04  # inside an entry's start offset: still well formed, only the CRC knows
        checkpoint.write_bytes(bytes(raw))
    else:
        checkpoint.write_bytes(b"\x00" * 7)
    reopened = _open(tmp_path / "p")
    assert reopened.epoch_entries() == expected == [(1, 0), (4, 60)]
    assert LeaderEpochCache(tmp_path / "p").load()  # and it was written back
    reopened.close()


def test_a_checkpoint_ahead_of_a_log_that_lost_its_tail_is_cut(tmp_path: Path) -> None:
    log = _open(tmp_path / "p")
    _append(log, 1, 2, seed=1)
    _append(log, 2, 1, seed=2)  # the checkpoint names epoch 2 at offset 6 ...
    log.flush()
    assert LeaderEpochCache(tmp_path / "p").load()
    abandon(log)
    last = segment_files(tmp_path / "p")[-1]
    data = last.read_bytes()
    last.write_bytes(data[: data.rfind(b"\x02\x00\x00\x00\x02") - 19])  # ... whose batch a crash lost
    reopened = _open(tmp_path / "p")
    assert reopened.log_end_offset == 6
    assert reopened.epoch_entries() == [(1, 0)]
    reopened.close()


def test_the_checkpoint_is_written_by_the_flush_and_a_lagging_one_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "p"
    log = _open(path)
    _append(log, 1, 2, seed=1)
    assert not (path / CHECKPOINT_FILE).exists()  # not on the produce path
    log.flush()
    on_disk = LeaderEpochCache(path)
    assert on_disk.load()
    assert on_disk.entries() == [(1, 0)]
    _append(log, 3, 2, seed=2)  # a new epoch, then a crash before the next flush
    abandon(log)
    on_disk = LeaderEpochCache(path)
    assert on_disk.load()
    assert on_disk.entries() == [(1, 0)]  # the file lags the log ...
    reopened = _open(path)
    assert reopened.epoch_entries() == [(1, 0), (3, 6)]  # ... and is rebuilt from the batches
    assert reopened.end_offset_for_epoch(1) == (1, 6)
    reopened.close()


def test_truncate_to_cuts_segments_indexes_and_epochs_and_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "p"
    log = _open(path)
    _append(log, 1, 30, seed=1)
    _append(log, 3, 30, seed=2)
    before = read_all(log)
    segments_before = len(segment_files(path))
    log.truncate_to(45)  # inside epoch 1, several segments back
    assert log.log_end_offset == 45
    assert len(segment_files(path)) < segments_before
    assert log.epoch_entries() == [(1, 0)]
    assert [r.value for r in read_all(log)] == [r.value for r in before[:45]]
    log.append(make_batch(2, seed=9), leader_epoch=4)  # appends go on from the cut
    assert log.epoch_entries() == [(1, 0), (4, 45)]
    log.truncate_to(1000)  # beyond the end: nothing
    assert log.log_end_offset == 47
    log.close()
    reopened = _open(path)
    assert reopened.log_end_offset == 47
    assert [r.value for r in read_all(reopened)][:45] == [r.value for r in before[:45]]
    assert reopened.epoch_entries() == [(1, 0), (4, 45)]
    reopened.truncate_fully_and_start_at(500)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (500, 500)
    assert reopened.epoch_entries() == []
    reopened.append_replicated(_stamped(make_batch(2), base=500, epoch=6))
    reopened.close()
    again = _open(path)
    assert (again.log_start_offset, again.log_end_offset, again.epoch_entries()) == (500, 502, [(6, 500)])
    again.close()


def _stamped(batch: bytes, base: int, epoch: int) -> bytes:
    from sluice.codec.batch import stamp

    buf = bytearray(batch)
    stamp(buf, 0, base, 1, epoch)
    return bytes(buf)


def test_a_replicated_append_must_continue_the_log(tmp_path: Path) -> None:
    log = _open(tmp_path / "p")
    log.append_replicated(_stamped(make_batch(2), base=0, epoch=3))
    with pytest.raises(CorruptBatch, match="expected 2"):
        log.append_replicated(_stamped(make_batch(2), base=5, epoch=3))
    with pytest.raises(CorruptBatch, match="in epoch 2 after epoch 3"):
        log.append_replicated(_stamped(make_batch(2), base=2, epoch=2))
    assert log.log_end_offset == 2
    log.close()


# ---- divergence between two logs (KIP-101, KIP-279) ------------------------------------------


def test_kip101_scenario_1_a_follower_behind_the_high_watermark_keeps_its_records(tmp_path: Path) -> None:
    """A follower has every record but its high watermark lags (it never heard of the last
    advance). Truncating to it would drop a committed record the next leader then lacks."""
    leader, follower = _open(tmp_path / "a"), _open(tmp_path / "b")
    _append(leader, 0, 2, seed=1)  # m1, m2: offsets 0..5
    _replicate(follower, leader)
    follower_hw = 3  # it saw the HW move past m1 only
    naive = follower_hw
    point = _become_follower(follower, leader)
    assert point == 6 != naive  # nothing diverged: nothing is cut
    assert _log_bytes(tmp_path / "a") == _log_bytes(tmp_path / "b")
    leader.close()
    follower.close()


def test_kip101_scenario_2_a_returning_leader_truncates_exactly_its_divergent_tail(tmp_path: Path) -> None:
    """A leader took writes its follower never got, both crashed, the follower came back first and
    led a new epoch at the same offsets. The old leader must drop exactly its unreplicated tail."""
    a, b = _open(tmp_path / "a"), _open(tmp_path / "b")
    _append(a, 0, 2, seed=1)  # offsets 0..5, replicated
    _replicate(b, a)
    _append(a, 0, 2, seed=2)  # offsets 6..11: acks=1, never replicated
    _append(b, 1, 3, seed=3)  # b leads epoch 1 from offset 6: 6..14
    a_hw = 12  # a's high watermark could have been anywhere up to its LEO: naive keeps 6..11
    point = _become_follower(a, b)
    assert point == 6
    assert a_hw != point
    assert a.epoch_entries() == b.epoch_entries() == [(0, 0), (1, 6)]
    assert _log_bytes(tmp_path / "a") == _log_bytes(tmp_path / "b")
    assert [r.value for r in read_all(a)] == [r.value for r in read_all(b)]
    a.close()
    b.close()


def test_kip279_back_to_back_failovers_need_more_than_one_round(tmp_path: Path) -> None:
    """a leads epoch 1 and writes 6..8 that nobody gets; b leads epoch 2 from 6 and c copies it;
    then c leads epoch 3. When a returns, c's answer about epoch 1 is epoch 0 ending at 6,
    and a has epoch 0 too: one round settles it. When b ALSO wrote in epoch 2 beyond what c got,
    and a held an epoch c never saw, the follower must ask again with a lower epoch."""
    a, b, c = _open(tmp_path / "a"), _open(tmp_path / "b"), _open(tmp_path / "c")
    _append(a, 0, 2, seed=1)  # 0..5 everywhere
    _replicate(b, a)
    _replicate(c, a)
    _append(a, 1, 1, seed=2)  # a: epoch 1 at 6..8, lost with a
    _append(b, 2, 2, seed=3)  # b: epoch 2 at 6..11
    _replicate(c, b)  # c copies b's epoch 2
    _append(b, 2, 1, seed=4)  # b: 12..14, never reaches c
    _append(c, 3, 2, seed=5)  # c leads epoch 3 from 12
    # b returns as follower of c: epoch 2 is shared, ends at 12 on c: b cuts 12..14.
    assert _become_follower(b, c) == 12
    # a returns: its latest epoch 1 is unknown to c, whose answer is epoch 0 ending at 6.
    calls: list[int] = []

    def ask_c(epoch: int) -> tuple[int, int]:
        calls.append(epoch)
        return c.end_offset_for_epoch(epoch)

    assert divergence_offset(a, ask_c) == 6
    a.truncate_to(6)
    _replicate(a, c)
    for log in (a, b):
        assert _log_bytes(log.directory) == _log_bytes(tmp_path / "c")
        assert log.epoch_entries() == c.epoch_entries() == [(0, 0), (2, 6), (3, 12)]
    for log in (a, b, c):
        log.close()


def test_kip279_a_follower_asks_again_about_an_epoch_the_leader_never_had(tmp_path: Path) -> None:
    """The follower holds epochs 0, 1, 3; the leader 0, 2, 4. Asked about 3, the leader answers
    with its epoch 2 (ending where 4 starts); the follower has no epoch 2, so it asks about its
    own largest below it, 1; the leader answers epoch 0 ending at 4, which they share."""
    leader, follower = _open(tmp_path / "l"), _open(tmp_path / "f")
    _append(leader, 0, 1, seed=1)
    _replicate(follower, leader)  # 0..2 in epoch 0 on both
    leader.append(make_batch(1, seed=5), leader_epoch=0)  # 3: epoch 0 still, leader only
    _append(follower, 1, 2, seed=2)  # follower: epoch 1 at 3..8
    _append(follower, 3, 1, seed=3)  # follower: epoch 3 at 9..11
    _append(leader, 2, 2, seed=4)  # leader: epoch 2 at 4..9
    _append(leader, 4, 1, seed=6)  # leader: epoch 4 at 10..12
    asked: list[int] = []

    def ask(epoch: int) -> tuple[int, int]:
        asked.append(epoch)
        return leader.end_offset_for_epoch(epoch)

    assert divergence_offset(follower, ask) == 3
    assert asked == [3, 1]
    follower.truncate_to(3)
    _replicate(follower, leader)
    assert _log_bytes(tmp_path / "f") == _log_bytes(tmp_path / "l")
    leader.close()
    follower.close()


Runs = list[tuple[int, int]]
History = tuple[Runs, int, int, Runs, Runs]


@st.composite
def _histories(draw: st.DrawFn) -> History:
    """Two replicas' histories after a shared prefix, as (epoch, batches) runs.

    Each epoch has one leader, so the epochs each side wrote after the prefix are disjoint; the
    current leader holds the highest epoch; at most one side has more of the last shared epoch."""
    shared_epochs = sorted(draw(st.sets(st.integers(0, 30), min_size=1, max_size=4)))
    shared = [(e, draw(st.integers(1, 3))) for e in shared_epochs]
    last = shared_epochs[-1]
    pool = draw(st.lists(st.integers(last + 1, 60), unique=True, max_size=6))
    follower_new = sorted(e for i, e in enumerate(pool) if i % 2)
    leader_new = sorted(e for i, e in enumerate(pool) if not i % 2)
    if follower_new and (not leader_new or leader_new[-1] < follower_new[-1]):
        leader_new.append(follower_new[-1] + 1)  # the leader's epoch is the newest
    extra = draw(st.integers(0, 2))
    leader_extra, follower_extra = (extra, 0) if draw(st.booleans()) else (0, extra)
    return (
        shared,
        leader_extra,
        follower_extra,
        [(e, draw(st.integers(1, 3))) for e in leader_new],
        [(e, draw(st.integers(1, 3))) for e in follower_new],
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=_histories())
def test_any_divergence_is_found_exactly_and_healed_byte_for_byte(tmp_path: Path, history: History) -> None:
    shared, leader_extra, follower_extra, leader_new, follower_new = history
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        leader, follower = _open(Path(d) / "l"), _open(Path(d) / "f")
        seed = 0
        for epoch, n in shared:
            _append(leader, epoch, n, seed := seed + 1)
        _replicate(follower, leader)
        shared_end = leader.log_end_offset
        last_shared = shared[-1][0]
        _append(leader, last_shared, leader_extra, seed := seed + 1)
        _append(follower, last_shared, follower_extra, seed := seed + 1)
        for epoch, n in leader_new:
            _append(leader, epoch, n, seed := seed + 1)
        for epoch, n in follower_new:
            _append(follower, epoch, n, seed := seed + 1)
        point = divergence_offset(follower, leader.end_offset_for_epoch)
        assert point == shared_end
        follower.truncate_to(point)
        _replicate(follower, leader)
        assert _log_bytes(Path(d) / "f") == _log_bytes(Path(d) / "l")
        assert follower.epoch_entries() == leader.epoch_entries()
        leader.close()
        follower.close()


def test_a_crash_in_the_middle_of_a_truncation_leaves_a_prefix_of_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Later segments go newest first, then the cut: a crash between leaves a valid, shorter log,
    and the follower simply asks again where it diverges."""
    path = tmp_path / "p"
    log = _open(path)
    _append(log, 1, 80, seed=1)
    before = read_all(log)
    assert len(segment_files(path)) > 2

    def crash(fd: int, length: int) -> None:
        raise OSError(5, "simulated crash before the cut")

    monkeypatch.setattr(os, "ftruncate", crash)
    with pytest.raises(Exception, match="truncating"):
        log.truncate_to(9)
    monkeypatch.undo()
    # The log says what is left: the later segments are gone, the cut did not happen.
    assert 9 < log.log_end_offset < len(before)
    assert [r.value for r in read_all(log)] == [r.value for r in before[: log.log_end_offset]]
    abandon(log)
    reopened = _open(path)
    got = [r.value for r in read_all(reopened)]
    assert got == [r.value for r in before[: len(got)]]  # a prefix, dense from 0
    assert 9 < reopened.log_end_offset < len(before)
    reopened.truncate_to(9)  # the retry finishes the job
    assert reopened.log_end_offset == 9
    reopened.close()
