"""Delayed and scheduled delivery: the schedule topic's time-bucket index and the scheduler that appends
each pending record to its topic when due (docs/delayed-delivery.md)."""
