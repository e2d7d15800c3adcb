"""The one place the CLI builds an SDK client, so every command connects the same way."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sluice import DEFAULT_BOOTSTRAP

if TYPE_CHECKING:
    from sluice.client.client import Client

CLIENT_ID = "sluice-cli"
DEFAULT_REQUEST_TIMEOUT = 30.0


def default_bootstrap() -> str:
    """``SLUICE_BOOTSTRAP`` if set, else the contract's default ``127.0.0.1:7600``."""
    return os.environ.get("SLUICE_BOOTSTRAP") or DEFAULT_BOOTSTRAP


@contextlib.contextmanager
def connect(args: argparse.Namespace) -> Iterator[Client]:
    """A client for ``--bootstrap``, closed when the command ends (also on errors and Ctrl-C)."""
    # Imported here: the SDK pulls in gRPC, which `sluice up` and `--help` do not need.
    from sluice import Client

    client = Client(args.bootstrap, client_id=CLIENT_ID, request_timeout=args.request_timeout)
    try:
        yield client
    finally:
        client.close()
