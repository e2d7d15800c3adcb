"""The batch receive's permit hand-off and the ack ranges' one-run path (issue 19, session 14).

- ``Outbound.wait_flow_written``: ``receive_many`` waits (briefly) until the stream's writer has
  written the permits it just granted, so that the grant is not left waiting for the GIL while the
  application computes on the batch. The writer counts a grant as written when it asks for its next
  command, i.e. once the command holding it was handed on.
- ``outbound.ack_ranges``: a group of acks of one partition that is one run takes a C-level path; any
  group (duplicates, holes, several partitions) must give exactly the runs a set of offsets has.
"""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.client.push.outbound import Outbound, ack_ranges
from sluice.v1 import dispatcher_pb2 as pb
from tests.examples import examples


def test_a_grant_counts_as_written_once_the_writer_handed_its_command_on() -> None:
    out = Outbound(pb.Subscribe(topic="t", subscription="s"), ack_group_time=0)
    commands = iter(out)
    assert next(commands).HasField("subscribe")
    first = out.flow(10)
    second = out.flow(5)
    assert second == first + 1
    got: list[pb.ConsumerCommand] = []
    writer = threading.Thread(target=lambda: got.extend(commands), daemon=True)
    writer.start()  # takes the Flow, then asks for the next command (and waits: nothing pending)
    out.wait_flow_written(second, timeout=30)
    assert out._flows_written >= second  # not the timeout: written
    out.close()
    writer.join(timeout=30)
    assert [c.flow.permits for c in got] == [15]


def test_waiting_for_a_grant_nobody_writes_ends_at_the_timeout() -> None:
    out = Outbound(pb.Subscribe(topic="t", subscription="s"))
    seq = out.flow(3)
    out.wait_flow_written(seq, timeout=0.01)
    assert out._flows_written < seq


def _reference(acks: list[tuple[int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for p in sorted({p for p, _ in acks}):
        offsets = sorted({o for q, o in acks if q == p})
        bounds: list[int] = []
        for o in offsets:
            if bounds and bounds[-1] == o:
                bounds[-1] = o + 1
            else:
                bounds += (o, o + 1)
        out[p] = bounds
    return out


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just(0), st.integers(0, 30)),
            st.tuples(st.integers(0, 2), st.integers(0, 30)),
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(0, 1),
)
def test_ack_ranges_equal_the_runs_of_a_set(acks: list[tuple[int, int]], one_run: int) -> None:
    if one_run:  # the usual group: one partition, consecutive offsets, any order
        acks = [(0, o) for o in range(acks[0][1], acks[0][1] + len(acks))][::-1]
    assert ack_ranges(acks) == _reference(acks)
