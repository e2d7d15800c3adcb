"""The typed error of batch compression (docs/compression.md). Re-exported by ``sluice.errors``.

A module of its own because ``sluice.errors`` is at the module size limit; it depends only on the root
class, so importing it from ``sluice.errors`` makes no cycle.
"""

from __future__ import annotations

from sluice.error_base import SluiceError
from sluice.v1 import common_pb2


class UnsupportedCompression(SluiceError, ValueError):
    """A codec this side cannot use: attribute bits that name no codec, a codec name the producer does not
    know, or a codec whose library is not installed (the message names the extra to install, e.g.
    ``pip install 'sluice[lz4]'``). Not retriable: the same bytes or settings fail the same way."""

    code = common_pb2.UNSUPPORTED_COMPRESSION
    grpc_status = "INVALID_ARGUMENT"
