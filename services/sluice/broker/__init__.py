"""The broker: serves partition logs over gRPC and the wire protocol (Produce, Fetch, ListOffsets,
UpdatePartitions).

Layers, outermost first (docs/architecture.md):

- transport adapters, translation only: ``servicer`` (gRPC), ``wire_server`` (wire frames),
  ``handlers`` (protobuf <-> domain for both, per-message metrics);
- the core, one implementation per operation: ``service`` (validation, authorization through
  ``context``, routing to partition logs, typed errors, acks and flush waits, fetch sessions),
  ``requests`` (its domain types), ``follow`` (continuous fetches), ``longpoll`` (the one
  parked-read mechanism);
- pure parts, testable without I/O: ``fetch`` (limits and the per-request read state),
  ``filtering`` (tag filters over raw batches), ``sessions`` (KIP-227 fetch sessions),
  ``assignment`` (which partitions this broker serves).

The storage engine lives in ``sluice.broker.log``. See docs/fetch.md for the fetch contract.
"""
