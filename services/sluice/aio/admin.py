"""The asyncio admin: every method of the sync :class:`~sluice.client.admin.Admin`, awaited.

Each call is the sync method run in a worker thread (they are single RPCs or short sequences of
them), so the admin API, its arguments, results and typed errors are the sync SDK's own:
``await client.admin.create_topic("orders", partitions=4)``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from sluice.client.admin import Admin as SyncAdmin

__all__ = ["Admin"]


class Admin:
    """``await admin.<method>(...)`` for every method of the sync Admin (topics, groups, subscriptions,
    ACLs, quotas, users)."""

    def __init__(self, sync: SyncAdmin) -> None:
        self._sync = sync

    @property
    def sync(self) -> SyncAdmin:
        return self._sync

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        target = getattr(self._sync, name)
        if not callable(target) or name.startswith("_"):
            raise AttributeError(name)
        method: Callable[..., Any] = target

        async def call(*args: Any, **kwargs: Any) -> Any:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, functools.partial(method, *args, **kwargs))

        call.__name__ = name
        call.__doc__ = method.__doc__
        return call

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *(n for n in dir(self._sync) if not n.startswith("_"))})
