"""Undecodable requests and oversize error messages at the server's edge (sluice.server.decoding,
sluice.errors.bounded_message): found by the RPC fuzz suite (tests/integration/fuzz)."""

from __future__ import annotations

import pytest

from sluice.errors import MAX_ERROR_MESSAGE_BYTES as MAX_DETAILS_BYTES
from sluice.errors import InvalidArgument
from sluice.errors import bounded_message as bounded_details
from sluice.server.decoding import RequestDecoder
from sluice.v1 import coordinator_pb2


def test_a_request_that_does_not_parse_is_invalid_argument() -> None:
    decoder = RequestDecoder("BrokerHeartbeat", coordinator_pb2.BrokerHeartbeatRequest.FromString)
    with pytest.raises(InvalidArgument, match=r"\(2 bytes\) is not a valid BrokerHeartbeat request"):
        decoder.decode(b"\xff\xff")


def test_a_request_that_parses_is_the_message() -> None:
    decoder = RequestDecoder("BrokerHeartbeat", coordinator_pb2.BrokerHeartbeatRequest.FromString)
    raw = coordinator_pb2.BrokerHeartbeatRequest(broker_id=3).SerializeToString()
    assert decoder.decode(raw).broker_id == 3


@pytest.mark.parametrize("char", ["x", "é", "💥"])
def test_an_oversize_message_is_cut_and_says_its_length(char: str) -> None:
    message = f"unknown group {char * 70_000}"
    cut = bounded_details(message)
    assert len(cut.encode()) < MAX_DETAILS_BYTES + 50
    assert cut.startswith("unknown group ")
    assert cut.endswith(f"(cut: {len(message)} characters)")


def test_a_short_message_is_unchanged() -> None:
    assert bounded_details("unknown group g") == "unknown group g"
