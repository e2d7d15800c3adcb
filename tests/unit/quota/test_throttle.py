"""The quota meters and KIP-219 throttle (sluice.quotas.throttle, gate), on a fake clock."""

from __future__ import annotations

import asyncio
import functools

import pytest

from sluice.quotas.gate import ThrottleGate
from sluice.quotas.model import Kind, Limits, QuotaKey, QuotaSnapshot, Resource, key_of
from sluice.quotas.throttle import BURST_S, MAX_THROTTLE_S, PRODUCE, QuotaManager, admit, throttle_ms
from sluice.security.context import WIRE, RequestContext
from sluice.security.model import ANONYMOUS, Principal

HOG = RequestContext(ANONYMOUS, WIRE, client_id="hog")
OTHER = RequestContext(ANONYMOUS, WIRE, client_id="other")
ALICE = RequestContext(Principal("alice"), WIRE, client_id="hog")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def manager(quotas: dict[QuotaKey, Limits], clock: Clock) -> QuotaManager:
    return QuotaManager(QuotaSnapshot(quotas, 1), clock=clock, burst_s=1.0)


def produce(n: float) -> list[tuple[Resource, float]]:
    return [(Resource.PRODUCE_BYTES, n), (Resource.REQUESTS, 1.0)]


def test_the_principal_decides_else_the_client_id() -> None:
    assert key_of(ALICE.principal, "hog") == QuotaKey(Kind.USER, "alice")
    assert key_of(ANONYMOUS, "hog") == QuotaKey(Kind.CLIENT, "hog")


def test_no_quota_no_throttle() -> None:
    clock = Clock()
    quotas = manager({QuotaKey(Kind.CLIENT, "hog"): Limits(produce_bytes_per_second=1000)}, clock)
    assert not QuotaManager().enabled
    for _ in range(100):
        assert quotas.record(OTHER, produce(1e6)) == 0
        assert quotas.hold_s(OTHER, PRODUCE) == 0


def test_a_burst_of_one_second_then_the_exact_delay_back_under_the_quota() -> None:
    clock = Clock()
    quotas = manager({QuotaKey(Kind.CLIENT, "hog"): Limits(produce_bytes_per_second=1000)}, clock)
    assert quotas.record(HOG, produce(1000)) == 0  # one second's worth: the burst
    assert quotas.hold_s(HOG, PRODUCE) == 0
    assert quotas.record(HOG, produce(500)) == pytest.approx(0.5)
    assert quotas.hold_s(HOG, PRODUCE) == pytest.approx(0.5)
    clock.now += 0.5
    assert quotas.hold_s(HOG, PRODUCE) == pytest.approx(0)


def test_a_caller_that_waits_out_each_hold_gets_exactly_its_rate() -> None:
    clock = Clock()
    quotas = manager({QuotaKey(Kind.CLIENT, "hog"): Limits(produce_bytes_per_second=2_000_000)}, clock)
    start, sent = clock.now, 0
    while clock.now - start < 60:
        clock.now += quotas.hold_s(HOG, PRODUCE) + 0.001  # the timer fires a little late
        quotas.record(HOG, produce(65_536))
        sent += 65_536
    rate = sent / (clock.now - start)
    assert rate == pytest.approx(2_000_000 * (1 + 1.0 / 60), rel=0.02)  # the quota, plus the burst


def test_a_caller_held_up_catches_up_within_the_burst() -> None:
    clock = Clock()
    quotas = QuotaManager(
        QuotaSnapshot({QuotaKey(Kind.CLIENT, "hog"): Limits(produce_bytes_per_second=1000)}, 1), clock=clock
    )
    for _ in range(50):  # steady at the quota
        clock.now += quotas.hold_s(HOG, PRODUCE)
        quotas.record(HOG, produce(100))
    clock.now += BURST_S  # a stall as long as the burst
    sent = 0
    while quotas.hold_s(HOG, PRODUCE) <= 0 and sent < 10_000:
        quotas.record(HOG, produce(100))
        sent += 100
    assert sent == pytest.approx(BURST_S * 1000, abs=100)  # what the stall cost, sent at once


def test_a_request_quota_and_a_byte_quota_the_larger_throttle_wins() -> None:
    clock = Clock()
    quotas = manager(
        {QuotaKey(Kind.CLIENT, "hog"): Limits(produce_bytes_per_second=1e9, requests_per_second=10)}, clock
    )
    throttles = [quotas.record(HOG, produce(10)) for _ in range(20)]
    assert throttles[9] == 0
    assert throttles[-1] == pytest.approx(1.0)  # 20 requests at 10/s: one second beyond the burst


def test_a_default_quota_meters_each_caller_on_its_own() -> None:
    clock = Clock()
    quotas = manager({QuotaKey(Kind.CLIENT, ""): Limits(produce_bytes_per_second=1000)}, clock)
    assert quotas.record(HOG, produce(3000)) == pytest.approx(2)
    assert quotas.record(OTHER, produce(1000)) == 0
    # A user's own quota is not the client id's.
    assert quotas.record(ALICE, produce(1e9)) == 0


def test_one_huge_request_throttles_for_at_most_the_cap() -> None:
    clock = Clock()
    quotas = manager({QuotaKey(Kind.CLIENT, "hog"): Limits(produce_bytes_per_second=1)}, clock)
    assert quotas.record(HOG, produce(1e9)) == pytest.approx(MAX_THROTTLE_S)
    clock.now += MAX_THROTTLE_S
    assert quotas.hold_s(HOG, PRODUCE) == 0


def test_removing_the_quotas_lifts_every_throttle() -> None:
    clock = Clock()
    quotas = manager({QuotaKey(Kind.CLIENT, "hog"): Limits(produce_bytes_per_second=1)}, clock)
    quotas.record(HOG, produce(100))
    assert quotas.hold_s(HOG, PRODUCE) > 0
    quotas.replace(QuotaSnapshot({}, 2))
    assert quotas.hold_s(HOG, PRODUCE) == 0


def test_removing_one_quota_lifts_its_throttle_and_keeps_the_others() -> None:
    clock = Clock()
    limits = Limits(produce_bytes_per_second=1)
    quotas = manager({QuotaKey(Kind.CLIENT, "hog"): limits, QuotaKey(Kind.CLIENT, "other"): limits}, clock)
    quotas.record(HOG, produce(100))
    quotas.record(OTHER, produce(100))
    quotas.replace(QuotaSnapshot({QuotaKey(Kind.CLIENT, "other"): limits}, 2))
    assert quotas.hold_s(HOG, PRODUCE) == 0
    assert quotas.hold_s(OTHER, PRODUCE) > 0
    # A resource without a rate any more holds nothing either.
    quotas.replace(QuotaSnapshot({QuotaKey(Kind.CLIENT, "other"): Limits(fetch_bytes_per_second=1)}, 3))
    assert quotas.hold_s(OTHER, PRODUCE) == 0


def test_throttle_ms_rounds_up() -> None:
    assert throttle_ms(0) == 0
    assert throttle_ms(0.0001) == 1
    assert throttle_ms(1.5) == 1501


def test_the_gate_holds_frames_in_order_until_the_hold_passed() -> None:
    asyncio.run(_gate_holds())


async def _gate_holds() -> None:
    quotas = QuotaManager(
        QuotaSnapshot({QuotaKey(Kind.CLIENT, "hog"): Limits(produce_bytes_per_second=1000)}, 1), burst_s=1.0
    )
    ran: list[int] = []
    ready = asyncio.Event()
    gate = ThrottleGate(quotas, ready.set)

    def run(i: int) -> None:
        ran.append(i)
        quotas.record(HOG, produce(100))

    quotas.record(HOG, produce(1100))  # 0.1 s over
    loop = asyncio.get_running_loop()
    started = loop.time()
    for i in range(3):
        assert gate.offer(HOG, PRODUCE, functools.partial(run, i))
    assert gate.muted
    await asyncio.wait_for(ready.wait(), 5)
    while gate.muted:
        ready.clear()
        await asyncio.wait_for(ready.wait(), 5)
    assert ran == [0, 1, 2]
    assert loop.time() - started >= 0.29  # each frame waited for the one before it
    gate.close()


def test_admit_delays_subscribes_to_their_rate() -> None:
    asyncio.run(_admit_delays())


async def _admit_delays() -> None:
    quotas = QuotaManager(
        QuotaSnapshot({QuotaKey(Kind.CLIENT, "hog"): Limits(subscribes_per_second=20)}, 1), burst_s=1.0
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.gather(*(admit(quotas, HOG, Resource.SUBSCRIBES) for _ in range(30)))
    # 20 in the burst, then 10 at 20/s.
    assert loop.time() - started == pytest.approx(0.5, abs=0.25)
