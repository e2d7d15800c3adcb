"""Fixtures of the CLI unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sluice.cli.supervisor import Supervisor


@pytest.fixture
def sup() -> Iterator[Supervisor]:
    """A supervisor whose children (processes or service threads) are all stopped after the test."""
    s = Supervisor(grace=5.0)
    try:
        yield s
    finally:
        s.stop_all()
        s.waker.close()
