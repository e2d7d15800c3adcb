"""Validation of user-chosen names (topics, groups, subscriptions)."""

from __future__ import annotations

import re

from sluice.errors import InvalidArgument, InvalidTopic

# Kafka's rule: ASCII letters, digits, '.', '_' and '-', 1 to 249 characters.
_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
MAX_PARTITIONS = 10_000


def validate_topic(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise InvalidTopic(
            f"invalid topic name {name!r}: use 1-249 characters from [a-zA-Z0-9._-], not '.' or '..'"
        )
    return name


def validate_group(name: str, what: str = "group") -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgument(f"invalid {what} name {name!r}: use 1-249 characters from [a-zA-Z0-9._-]")
    return name
