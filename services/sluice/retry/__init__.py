"""Retry and dead letters of pull groups (RocketMQ's model): delay levels, the retry and DLQ topics'
names, the headers a retried record carries, and the DLQ redrive (docs/retry.md)."""
