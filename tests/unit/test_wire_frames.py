"""Framing of the wire protocol: frames cut right whatever the chunking, hostile lengths refused."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.common.wire import HEADER, FrameReader, FrameType, WireProtocolError, frame

FRAMES = st.lists(
    st.tuples(st.sampled_from(list(FrameType)), st.binary(max_size=300)), min_size=1, max_size=20
)


@given(frames=FRAMES, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
def test_frames_come_out_whole_and_in_order_however_the_bytes_are_cut(
    frames: list[tuple[FrameType, bytes]], cuts: list[int]
) -> None:
    stream = b"".join(frame(kind, payload) for kind, payload in frames)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    reader = FrameReader()
    got: list[tuple[int, bytes]] = []
    for start, stop in itertools.pairwise(points):
        got += reader.feed(stream[start:stop])
    assert got == [(int(kind), payload) for kind, payload in frames]
    assert reader.buffered == 0


def test_a_reused_receive_buffer_does_not_corrupt_a_partial_frame() -> None:
    data = frame(FrameType.FETCH, b"a" * 10) + frame(FrameType.FETCH, b"b" * 10)
    chunk = bytearray(16)
    reader = FrameReader()
    got: list[tuple[int, bytes]] = []
    for pos in range(0, len(data), 16):
        piece = data[pos : pos + 16]
        chunk[: len(piece)] = piece
        got += reader.feed(memoryview(chunk)[: len(piece)])
        chunk[:] = b"\xff" * 16  # the caller reuses its buffer
    assert got == [(FrameType.FETCH, b"a" * 10), (FrameType.FETCH, b"b" * 10)]


@pytest.mark.parametrize("length", [0, 1025, 2**32 - 1])
def test_a_frame_length_of_zero_or_over_the_cap_is_refused_before_buffering(length: int) -> None:
    reader = FrameReader(max_frame_bytes=1024)
    with pytest.raises(WireProtocolError, match="frames hold 1 to 1024 bytes"):
        reader.feed(HEADER.pack(length, FrameType.PRODUCE))


def test_a_frame_at_the_cap_is_accepted() -> None:
    reader = FrameReader(max_frame_bytes=1024)
    assert reader.feed(frame(FrameType.PRODUCE, b"x" * 1023)) == [(FrameType.PRODUCE, b"x" * 1023)]
