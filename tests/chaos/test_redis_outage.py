"""Issue 16, "Redis down or slow", the suite's short run: Redis stopped for 12 s, and separately paused
(``CLIENT PAUSE 12000 ALL``) for 12 s, under group consumption and a push subscription
(``tests/chaos/redis_outage.py`` says what is shown; the 30 s outages of the issue are
``bench/chaos/redis_outage.py``).

12 s is the shortest outage that still shows everything the 30 s one does: longer than the services'
Redis socket timeout (3 s), than the consumer's commit timeout here (5 s, so a commit sent into the pause
runs out of time and is reported in doubt), and than the offset store's warning interval (10 s, so the
rate-limited "still failing" warning is logged and counted against its bound).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.chaos.redis_outage import outage_stack, run
from tests.harness import ServiceProcess
from tests.integration.consumer.conftest import Cluster

OUTAGE_S = 12.0
COMMIT_TIMEOUT = "5s"


@pytest.fixture
def stack() -> Iterator[tuple[Cluster, ServiceProcess]]:
    with outage_stack() as s:
        yield s


def test_redis_stopped_and_paused_under_group_consumption(stack: tuple[Cluster, ServiceProcess]) -> None:
    cluster, dispatcher = stack
    run(cluster, dispatcher, OUTAGE_S, COMMIT_TIMEOUT)
