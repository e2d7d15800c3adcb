"""Example counts of the suite's heaviest property tests, against its time budget (docs/testing.md,
"Test-suite budget").

Each property names the count the suite runs; ``SLUICE_EXAMPLES_FACTOR`` multiplies it. The suite runs
factor 1; ``bench/properties.py`` runs the same properties at factor 10 (more than every count before the
budget), so the long runs keep finding what short ones might miss.
"""

from __future__ import annotations

import os

FACTOR = max(1, int(os.environ.get("SLUICE_EXAMPLES_FACTOR", "1")))


def examples(n: int) -> int:
    """``n`` examples in the suite, ``n * SLUICE_EXAMPLES_FACTOR`` in the long run."""
    return n * FACTOR
