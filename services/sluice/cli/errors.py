"""Errors that belong to the command line itself.

Wire errors (``sluice.errors``) keep their registered codes. The CLI has a few
failures of its own (a service of ``sluice up`` died, a feature that a later
release adds) that never travel on the wire, so they must not take a wire code:
:class:`CliError` is a ``SluiceError`` (the top-level handler prints every
``SluiceError`` the same way) whose code *name* is chosen per instance and whose
numeric code stays ``UNKNOWN``.
"""

from __future__ import annotations

from sluice.errors import SluiceError


class CliError(SluiceError):
    """A command-line failure: printed as ``error: <NAME>: <message>``."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self._name = name

    @property
    def code_name(self) -> str:
        return self._name


class UsageError(Exception):
    """Bad command-line input found after argparse ran: printed with the usage, exit code 2."""


def not_available(feature: str, arrives_with: str) -> CliError:
    """The error for a documented command whose server side is not built yet."""
    return CliError("NOT_AVAILABLE", f"{feature} is not available yet: it arrives with {arrives_with}")
