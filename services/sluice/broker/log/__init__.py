"""The broker's storage engine: segmented, indexed partition logs on local disk.

``PartitionLog`` is one partition (append, read, flush, retention, crash recovery);
``LogManager`` owns every partition directory of a broker. Synchronous, pure file I/O;
see docs/storage.md for the on-disk design.
"""

from sluice.broker.log.config import LogConfig
from sluice.broker.log.manager import LogManager
from sluice.broker.log.partition_log import PartitionLog
from sluice.broker.log.results import AppendResult, ReadResult

__all__ = ["AppendResult", "LogConfig", "LogManager", "PartitionLog", "ReadResult"]
