"""Process limits every Sluice process sets at start-up: the open-files limit.

Linux gives a process two limits on its descriptors (``RLIMIT_NOFILE``): a soft one, which
is what ``open``/``accept`` are held to, and a hard one, the ceiling an unprivileged process
may raise its soft limit to. Distributions and container runtimes commonly start processes
with soft 1,024 and a much higher hard limit (systemd: 524,288; Docker: 1,048,576). A broker
holds one descriptor per partition plus its connections, so at soft 1,024 it ran out at a
few hundred partitions (issue 20). Raising the soft limit to the hard one costs nothing
(the kernel allocates the descriptor table as it grows) and is what Kafka's install guide
asks operators to do by hand; every Sluice service does it itself, at start-up, and logs
both numbers so an operator sees the ceiling without a shell in the container.

Raising the hard limit needs privileges (``CAP_SYS_RESOURCE``): that stays the job of the
deployment (``ulimit -Hn``, systemd ``LimitNOFILE=``, Docker ``--ulimit nofile=``, the
chart's notes). See docs/kubernetes.md.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: Linux's per-process ceiling when the hard limit is "unlimited" (setrlimit refuses more).
_NR_OPEN = Path("/proc/sys/fs/nr_open")
#: Used when the hard limit is unlimited and ``nr_open`` cannot be read (not Linux).
_FALLBACK_CEILING = 1 << 20


@dataclass(frozen=True, slots=True)
class OpenFilesLimit:
    """The process's ``RLIMIT_NOFILE`` after start-up."""

    #: The soft limit before this process raised it.
    before: int
    #: The soft limit now: what opens and accepts are held to.
    soft: int
    #: The hard limit: the most the soft limit could be raised to.
    hard: int


def _ceiling(hard: int) -> int:
    if hard != resource.RLIM_INFINITY:
        return hard
    try:
        return int(_NR_OPEN.read_text())
    except (OSError, ValueError):
        return _FALLBACK_CEILING


def raise_open_files_limit() -> OpenFilesLimit:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit and log both; never fails.

    A limit that cannot be raised (a platform that refuses) is logged as a warning and the
    process runs with what it has: the broker then answers a typed error when it runs out,
    rather than not starting.
    """
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _ceiling(hard)
    soft = before
    if before == resource.RLIM_INFINITY or before >= target:
        log.info("open files limit: soft %d, hard %d (already at the hard limit)", before, hard)
        return OpenFilesLimit(before, before, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    except (ValueError, OSError) as exc:
        log.warning(
            "open files limit: soft %d, hard %d; could not raise the soft limit: %s", before, hard, exc
        )
        return OpenFilesLimit(before, before, hard)
    log.info("open files limit: soft %d raised to %d (the hard limit is %d)", before, soft, hard)
    return OpenFilesLimit(before, soft, hard)


def open_files_soft_limit() -> int:
    """The soft limit in force now (``RLIM_INFINITY`` reported as the kernel's ceiling)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return _ceiling(soft)
