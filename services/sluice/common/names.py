"""Validation of user-chosen names (topics, groups, subscriptions, client ids).

A name over its limit is refused by its length first, with the limit named and the name echoed cut
(``errors.echo``): a 1 MB topic name gets an error of a few hundred bytes (issue 16).
"""

from __future__ import annotations

import re

from sluice.errors import InvalidArgument, InvalidTopic, echo

#: Kafka's rule: ASCII letters, digits, '.', '_' and '-', 1 to 249 characters.
MAX_NAME_LENGTH = 249
_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
MAX_PARTITIONS = 10_000
#: A client id is free text (a process name, a host); Kafka bounds it only by its 16-bit string length.
#: 255 characters keeps it a sane label and key in the per-client tables (producer-id quota).
MAX_CLIENT_ID_LENGTH = 255


def _too_long(what: str, name: str, limit: int) -> str:
    return f"{what} of {len(name)} characters exceeds the limit of {limit} characters: {echo(name)}"


def validate_topic(name: str) -> str:
    if isinstance(name, str) and len(name) > MAX_NAME_LENGTH:
        raise InvalidTopic(_too_long("topic name", name, MAX_NAME_LENGTH))
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise InvalidTopic(
            f"invalid topic name {echo(name)}: use 1-249 characters from [a-zA-Z0-9._-], not '.' or '..'"
        )
    return name


def validate_group(name: str, what: str = "group") -> str:
    if isinstance(name, str) and len(name) > MAX_NAME_LENGTH:
        raise InvalidArgument(_too_long(f"{what} name", name, MAX_NAME_LENGTH))
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgument(f"invalid {what} name {echo(name)}: use 1-249 characters from [a-zA-Z0-9._-]")
    return name


def validate_client_id(client_id: str, what: str = "client id") -> str:
    """Any text (empty allowed: the SDK's default), up to ``MAX_CLIENT_ID_LENGTH`` characters. Also a
    static member's instance id (``what``)."""
    if len(client_id) > MAX_CLIENT_ID_LENGTH:
        raise InvalidArgument(_too_long(what, client_id, MAX_CLIENT_ID_LENGTH))
    return client_id
