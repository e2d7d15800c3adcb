"""One key operation written inside the coordinator's fenced write (``store.py``), next to its records.

Its own module because both the groups (``groups/redis_ops.py``: members, owners, offsets) and the cluster
(``cluster/redis_ops.py``, ``cluster/adopt.py``: topic identity) produce them: defined in either subpackage,
the two would import each other.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RedisOp"]


@dataclass(frozen=True)
class RedisOp:
    """One key operation inside the fenced write: ``HSET key a b``, ``HDEL key a``, ``SET key a``,
    ``DEL key``, ``HCOPY key a b`` (copy field ``b`` of hash ``a`` into hash ``key``; delete it there
    when ``a`` has none), or ``DELINDEX key a b`` (delete the hash ``a + id`` of every id in the set
    ``key``, and its field in hash ``b`` when ``b`` is given)."""

    op: str
    key: str
    a: str = ""
    b: str = ""
