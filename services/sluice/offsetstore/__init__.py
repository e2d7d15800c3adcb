"""The offset store: fenced group offsets and durable push cursors in Redis.

Layers: ``servicer`` (protobuf <-> domain) -> ``service`` (validation, error
mapping, metrics) -> ``storage`` (Redis, Lua-fenced writes). ``cursor_codec``
is the pure, dependency-free cursor encoding the dispatcher reuses.
"""
