"""The lock-free unacked ids and ack count (``client/push/unacked.py``): of threads racing to ack the
same ids, each id is removed (so sent and counted) by exactly one, and no count is lost."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sluice.client.push.outbound import AckKey
from sluice.client.push.unacked import AckCounter, Unacked, add_ids, discard_ids, pop_id, pop_ids


@contextmanager
def _tiny_switch_interval() -> Iterator[None]:
    """Threads switch every microsecond: a check-then-remove that is not atomic loses the race often."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def _race(n_threads: int, work: Callable[[int], None]) -> None:
    start = threading.Barrier(n_threads)

    def run(i: int) -> None:
        start.wait(10)
        work(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()


def test_pop_removes_once_and_says_so() -> None:
    unacked: Unacked = {}
    add_ids(unacked, [(0, 1, 5), (0, 2, 5), (1, 7, None)])
    assert pop_id(unacked, (0, 1, 5)) is True
    assert pop_id(unacked, (0, 1, 5)) is False, "a second ack of the same id removes nothing"
    assert pop_ids(unacked, [(0, 2, 5), (0, 3, 5), (1, 7, None)]) == [(0, 2, 5), (1, 7, None)]
    assert unacked == {}
    add_ids(unacked, [(2, 1, 1), (2, 2, 1)])
    discard_ids(unacked, [(2, 1, 1), (9, 9, 9)])
    assert list(unacked) == [(2, 2, 1)]


def _split_once(keys: list[AckKey]) -> tuple[list[AckKey], Unacked]:
    """Four threads pop the same ``keys``: the ids each removed, all together, and what is left."""
    unacked: Unacked = {}
    add_ids(unacked, keys)
    won: list[list[AckKey]] = [[] for _ in range(4)]

    def work(i: int) -> None:
        if i % 2:  # the batch path (ack_many) against the single one (ack)
            won[i] = pop_ids(unacked, keys)
        else:
            won[i] = [k for k in keys if pop_id(unacked, k)]

    with _tiny_switch_interval():
        _race(4, work)
    return [k for w in won for k in w], unacked


def test_racing_pops_split_the_ids_exactly() -> None:
    keys: list[AckKey] = [(p, o, 3) for p in range(4) for o in range(20_000)]
    for rnd in range(3):
        removed, left = _split_once(keys)
        assert len(removed) == len(keys), f"round {rnd}: an id acked twice or never"
        assert set(removed) == set(keys)
        assert left == {}


def test_ack_counter_loses_no_bump() -> None:
    counter = AckCounter()
    per_thread = 50_000

    def work(_i: int) -> None:
        bump = counter.bump
        for _ in range(per_thread):
            bump()

    with _tiny_switch_interval():
        _race(4, work)
    assert counter.value() == 4 * per_thread
    assert counter.value() == 4 * per_thread, "reading does not count"
    counter.bump()
    assert counter.value() == 4 * per_thread + 1
