"""KIP-320 in the fetcher, without a broker: fetches carry the leader epoch from Metadata, a new epoch
after records were fetched asks for a position check, and the check moves a position back only when the
new leader's log ends below it (docs/consumer.md, "Across a failover")."""

from __future__ import annotations

from sluice.client.fetch_session import FetchSession
from sluice.client.fetch_state import PartitionState, fetch_request, place
from sluice.client.fetch_validate import PositionValidator
from sluice.client.metadata import BrokerInfo, ClusterMetadata, PartitionInfo, TopicInfo
from sluice.common.peers import Peers
from sluice.errors import SluiceError
from sluice.v1 import broker_pb2


def metadata(epoch: int, leader: int = 1) -> ClusterMetadata:
    return ClusterMetadata(
        brokers={1: BrokerInfo(1, "127.0.0.1", 9), 2: BrokerInfo(2, "127.0.0.1", 10)},
        topics={"t": TopicInfo("t", "id", [PartitionInfo(0, leader, leader_epoch=epoch)])},
    )


def encode(parts: dict[tuple[str, int], PartitionState], session: FetchSession) -> broker_pb2.FetchRequest:
    req = session.build({tp: st.fetch_state(1024, "") for tp, st in parts.items()})
    return fetch_request(req, False, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, client_id="c")


def test_fetches_carry_the_leader_epoch_from_metadata_and_none_while_unknown() -> None:
    parts = {("t", 0): PartitionState(5)}
    unknown = encode(parts, FetchSession(False)).partitions[0]
    assert not unknown.HasField("current_leader_epoch")  # -1: not checked, and not sent
    place(metadata(3), parts, {}, [])
    sent = encode(parts, FetchSession(False)).partitions[0]
    assert sent.HasField("current_leader_epoch")
    assert sent.current_leader_epoch == 3
    assert sent.fetch_offset == 5


def test_an_incremental_session_resends_a_partition_whose_leader_epoch_changed() -> None:
    parts = {("t", 0): PartitionState(5)}
    leaders: dict[tuple[str, int], str | None] = {}
    place(metadata(3), parts, leaders, [])
    session = FetchSession(True)
    first = session.build({tp: st.fetch_state(1024, "") for tp, st in parts.items()})
    session.on_response(first, session_id=7)
    idle = encode(parts, session)
    assert list(idle.partitions) == []  # nothing changed: nothing sent
    place(metadata(4, leader=2), parts, leaders, [])
    changed = encode(parts, session)
    assert [p.current_leader_epoch for p in changed.partitions] == [4]
    assert leaders[("t", 0)] == "127.0.0.1:10"


def test_a_new_epoch_asks_for_a_position_check_only_after_records_were_fetched() -> None:
    parts = {("t", 0): PartitionState(0)}
    assert not place(metadata(3), parts, {}, [])
    assert not place(metadata(4), parts, {}, [])  # nothing fetched yet: nothing to check
    parts[("t", 0)].fetched_epoch = 4
    assert not place(metadata(4), parts, {}, [])  # the same epoch: nothing to check
    assert place(metadata(5), parts, {}, [])
    assert parts[("t", 0)].validate


def answer(epoch: int, end: int) -> broker_pb2.OffsetForLeaderEpochPartitionResponse:
    return broker_pb2.OffsetForLeaderEpochPartitionResponse(
        topic="t", partition=0, leader_epoch=epoch, end_offset=end
    )


def checked(position: int, epoch: int, end: int) -> tuple[PartitionState, PositionValidator]:
    st = PartitionState(position, leader_epoch=5, fetched_epoch=4, validate=True)
    errors: list[SluiceError] = []
    validator = PositionValidator(Peers(), 1.0, errors)
    validator._check(("t", 0), st, answer(epoch, end))
    assert errors == []
    return st, validator


def test_a_position_within_the_new_leaders_epoch_stands() -> None:
    st, validator = checked(position=100, epoch=4, end=120)
    assert (st.position, st.validate, st.fetched_epoch) == (100, False, 5)
    assert validator.truncations == 0
    st, validator = checked(position=120, epoch=4, end=120)  # exactly at the end: nothing lost
    assert st.position == 120
    assert validator.truncations == 0


def test_a_position_past_the_new_leaders_end_of_the_epoch_goes_back_to_it_and_is_counted() -> None:
    st, validator = checked(position=100, epoch=3, end=90)
    assert (st.position, st.validate) == (90, False)
    assert validator.truncations == 1
    st, validator = checked(position=100, epoch=-1, end=-1)  # the new leader has nothing that old
    assert st.position == 0
    assert validator.truncations == 1


def test_a_seek_with_a_committed_epoch_older_than_the_leaders_asks_for_a_check() -> None:
    st = PartitionState(0)
    place(metadata(5), {("t", 0): st}, {}, [])
    st.seek(100, 5)  # committed in the current epoch: nothing to check
    assert (st.position, st.fetched_epoch, st.validate) == (100, 5, False)
    st.seek(100, 3)  # committed in an older epoch
    assert st.validate
    st.seek(40, -1)  # a chosen offset: no epoch to check it by
    assert (st.position, st.fetched_epoch, st.validate) == (40, -1, False)
    fresh = PartitionState(0)
    fresh.seek(100, 3)  # before any metadata: the first placement decides
    assert not fresh.validate
    assert place(metadata(5), {("t", 0): fresh}, {}, [])
