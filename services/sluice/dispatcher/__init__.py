"""The dispatcher: Pulsar-style push consumption (issue 4).

Layers (docs/dispatcher.md):

- ``servicer.py`` translates the Consume stream and the describe RPCs between protobuf and domain values;
- ``service.py`` routes streams to subscriptions, runs partition feeds, timers, cursor flushes and the DLQ;
- ``subscription.py`` is the pure per-(topic, subscription) state machine (no I/O, time passed in), built
  from ``consumer.py``, ``selectors.py``/``keyshared.py`` (who gets a message), ``cursor.py``/``ranges.py``
  (what is acknowledged) and ``timers.py`` (nack delays, ack timeouts).
"""
