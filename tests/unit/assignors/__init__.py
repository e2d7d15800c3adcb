"""Unit tests for the partition assignors (pure functions, no network)."""
