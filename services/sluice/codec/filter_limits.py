"""The limits on a filter expression (tag or SQL92), one set per process.

Every filter a client sends is parsed and cached by the broker and the dispatcher, and an SQL92 one is
compiled: unbounded, an expression costs memory in the parse caches (4,096 cached 1 MB expressions hold
4 GB) and time in the parser (a deeply nested one). A service takes its limits from its config
(``server.config.FilterSettings``: ``--max-filter-length`` ...) at start-up (``set_filter_limits``, from
``server.runtime.service_tls``); the SDK, which checks a filter when it is given, uses the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FilterLimits", "filter_limits", "set_filter_limits"]


@dataclass(frozen=True, slots=True)
class FilterLimits:
    #: The longest expression, in characters (``%SQL92%`` prefix included): 64 tags of 60 characters fit.
    max_length: int = 4096
    #: The most tags a tag filter names (it has no nesting: its size is its tag count).
    max_tags: int = 256
    #: The deepest nesting of an SQL92 expression (parentheses, NOT, AND/OR chains).
    max_depth: int = 32
    #: The most values of one SQL92 ``IN`` list.
    max_in_list: int = 1024


_limits = FilterLimits()


def filter_limits() -> FilterLimits:
    """The limits in force in this process."""
    return _limits


def set_filter_limits(limits: FilterLimits) -> None:
    """Take a service's configured limits; at start-up, before any filter is parsed (the parse caches
    hold what was accepted under the limits of the time)."""
    global _limits
    _limits = limits
