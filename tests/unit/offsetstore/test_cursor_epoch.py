"""The cursor's leader epoch (format version 3): round trips, and cursors written before it still load.

The two blobs below were written by the codec as it was before version 3 (git 2ff5375); they must decode
to the same cursor, with no epoch (-1: the dispatcher does not validate such a cursor, as before).
"""

from __future__ import annotations

from array import array

import pytest

from sluice.offsetstore.cursor_codec import (
    MAGIC,
    MAGIC_V2,
    MAGIC_V3,
    CursorCodecError,
    decode_cursor,
    encode_cursor,
)

#: encode_cursor(100, [102, 105], {100: 2}) before version 3.
OLD_V1 = bytes.fromhex("534c433164000000000000000100000001000000010101789c63624e61020000df006c")
#: encode_cursor(100, [102, 105], {100: 2}, 140, [101, 102, 1]) before version 3.
OLD_V2 = bytes.fromhex(
    "534c4332640000000000000001000000010000000101018c0000000000000001000000789c63624e614a6580803428cd08a5011adf0138"
)


def test_cursors_written_before_the_epoch_still_load_without_one() -> None:
    v1, v2 = decode_cursor(OLD_V1), decode_cursor(OLD_V2)
    assert (v1.mark_delete, list(v1.acked_ranges), v1.redelivery_counts, v1.leader_epoch) == (
        100,
        [102, 105],
        {100: 2},
        -1,
    )
    assert (v2.delivered_up_to, list(v2.redelivery_ranges), v2.leader_epoch) == (140, [101, 102, 1], -1)


def test_a_cursor_without_an_epoch_is_written_as_before() -> None:
    """So an offset store older than version 3 reads every cursor of a cluster without replication."""
    assert encode_cursor(100, [102, 105], {100: 2}) == OLD_V1
    assert encode_cursor(100, [102, 105], {100: 2}, 140, [101, 102, 1]) == OLD_V2


@pytest.mark.parametrize("epoch", [0, 7, 2**31 - 1])
def test_the_epoch_round_trips_as_version_3(epoch: int) -> None:
    blob = encode_cursor(100, [102, 105], {100: 2}, 140, [101, 102, 1], leader_epoch=epoch)
    assert blob[:4] == MAGIC_V3
    state = decode_cursor(blob)
    assert state.leader_epoch == epoch
    assert (state.mark_delete, state.acked_ranges, state.redelivery_counts) == (
        100,
        array("q", [102, 105]),
        {100: 2},
    )
    assert (state.delivered_up_to, list(state.redelivery_ranges)) == (140, [101, 102, 1])
    bare = decode_cursor(encode_cursor(5, leader_epoch=epoch))
    assert (bare.mark_delete, bare.delivered_up_to, bare.leader_epoch) == (5, 0, epoch)


def test_magics_differ() -> None:
    assert len({MAGIC, MAGIC_V2, MAGIC_V3}) == 3


def test_a_bad_epoch_is_refused() -> None:
    with pytest.raises(CursorCodecError, match="leader_epoch"):
        encode_cursor(0, leader_epoch=-2)
    blob = bytearray(encode_cursor(0, leader_epoch=3))
    blob[4 + 8 + 4 + 4 + 3 + 8 + 4 : 4 + 8 + 4 + 4 + 3 + 8 + 4 + 4] = (-5).to_bytes(4, "little", signed=True)
    with pytest.raises(CursorCodecError, match="corrupt cursor header"):
        decode_cursor(bytes(blob))
    with pytest.raises(CursorCodecError, match="too short"):
        decode_cursor(encode_cursor(0, leader_epoch=3)[:38])
