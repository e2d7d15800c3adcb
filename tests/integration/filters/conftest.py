"""The consumer tests' whole-cluster fixture (real processes on loopback), reused for filter tests."""

from tests.integration.consumer.conftest import cluster

__all__ = ["cluster"]
