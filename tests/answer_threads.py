"""Which threads queue fetchers' answers: the fixture both driving tests (a waiting ``fetch()`` and a
waiting ``poll()`` read their own connection) use to see that no other thread handed an answer over."""

from __future__ import annotations

import threading

import pytest

from sluice.client.fetch_answer import Answers, Completion


@pytest.fixture
def putters(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The threads that queue fetchers' answers, in order (patched before the fetcher or consumer
    follows: its lane's callback holds the bound ``put``)."""
    seen: list[int] = []
    put = Answers.put

    def recording(self: Answers, item: Completion) -> None:
        seen.append(threading.get_ident())
        put(self, item)

    monkeypatch.setattr(Answers, "put", recording)
    return seen
