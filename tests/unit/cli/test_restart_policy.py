"""``sluice up --restart``: the wait before a restart doubles while a service keeps failing quickly."""

from __future__ import annotations

from sluice.cli.supervisor import RestartPolicy


def test_quick_failures_double_the_wait_up_to_the_cap_and_a_stable_run_resets_it() -> None:
    policy = RestartPolicy(first_delay=1, max_delay=8, stable_after=60)
    waits = []
    previous = 0.0
    for _ in range(6):
        previous = policy.delay(ran_for=2, previous=previous)
        waits.append(previous)
    assert waits == [1, 2, 4, 8, 8, 8]
    assert policy.delay(ran_for=61, previous=8) == 1
