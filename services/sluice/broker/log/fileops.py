"""The log's write seam: every data-changing file call of the log package goes through this module.

Defaults are the ``os`` functions themselves (bound at import: a module attribute lookup per call, no
wrapper frame), so production pays nothing. Tests replace an attribute (``fileops.write = ...``) to
inject ``ENOSPC``, ``EIO`` or short writes into segment, index, checkpoint and snapshot writes without
a full disk (tests/unit/broker_log/test_disk_full_seam.py); the real disk-full test uses a size-limited
tmpfs (tests/integration/broker/test_disk_full.py). Reads are not routed here: they cannot fill a disk.
"""

from __future__ import annotations

import errno
import os

#: ``os.write(fd, data) -> int``: segment appends, index entries, durable side files.
write = os.write
#: ``os.ftruncate(fd, length)``: cutting a failed append or index write back.
ftruncate = os.ftruncate

#: Errors that mean "out of space" (a quota counts as a full disk for the writer).
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write all of ``data`` (looping on short writes); raises the OSError of the write that failed."""
    view = memoryview(data)
    while view:
        view = view[write(fd, view) :]


def is_no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in NO_SPACE
