"""The coordinator: cluster metadata (brokers, topics, placement, dispatcher routing) and, from the next
issue on, consumer-group membership with server-side assignment.

Layout (three layers, style guide §1-2):

- ``servicer.py``  protobuf <-> domain objects only;
- ``service.py``   the service layer's domain API and lifecycle, over ``writer.py`` (the one write path:
  write lock, persistence, broker pushes, fencing) and ``timers.py`` (expiry, group timer, lag);
- ``state.py``     the pure state machine root; it routes each persisted record to the sub-machine that
  owns its type: ``cluster/`` (brokers, dispatchers, topics) now, ``groups/`` next;
- ``records.py``   the persisted record envelope and codec; ``store.py`` the Redis side (fenced writes,
  ``ops.py``'s key operations);
- ``assignors/``   pure assignment strategies (used by the group protocol).

Nothing here imports at package import time, so ``sluice.coordinator.assignors`` stays cheap to import.
"""
