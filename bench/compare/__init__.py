"""Sluice side by side with Redis Streams, NATS JetStream and RabbitMQ (issue 19): ``make compare``.

``workload`` makes and checks the records, ``servers`` starts and stops every system's own server
processes, ``adapters`` drive each system with its own Python client, ``runner`` runs producer and
consumer processes at the same time, ``report`` and ``plots`` write the table, the JSON, the PNGs
and docs/benchmarks.md. Run ``python -m compare --help`` from bench/ (the Makefile does).
"""
