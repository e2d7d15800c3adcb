"""The broker: serves partition logs over gRPC (Produce, Fetch, ListOffsets, UpdatePartitions).

Layers, outermost first:

- ``servicer``: protobuf <-> domain objects, nothing else;
- ``service``: routing to partition logs, validation, typed errors, acks and flush waits,
  long-poll parking, fetch sessions;
- pure parts, testable without I/O: ``fetch`` (limits and the per-request read state),
  ``filtering`` (tag filters over raw batches), ``sessions`` (KIP-227 fetch sessions),
  ``assignment`` (which partitions this broker serves).

The storage engine lives in ``sluice.broker.log``. See docs/fetch.md for the fetch contract.
"""
