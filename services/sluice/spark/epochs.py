"""Leader epochs in the Spark source's offsets (KIP-320; docs/spark.md, "Offsets and leader epochs").

A streaming offset maps ``"topic/partition"`` to where the next micro-batch starts. Each entry also keeps
the leader epoch the offset was planned in::

    {"orders/0": {"offset": 1200, "leaderEpoch": 4}, "orders/1": 980}

A plain number is an offset without an epoch: what every checkpoint written before epochs holds, and what
a partition whose epoch is unknown gets. Both load; one without an epoch is not checked (as a position
the SDK consumer is given without one).

The epoch is the partition's leader epoch read from the metadata *after* the offsets were listed, so it
is at least the epoch of the leader that answered: asking the current leader where a later epoch ends can
miss a truncation below the offset, but never report one that did not happen (the records below the
offset all sit in epochs at or below it, so that epoch ends at or past the offset).

Before a micro-batch is planned from a start offset, the start is checked with the partition's current
leader (``Client.check_positions``, the SDK fetcher's check) when the leader epoch moved since: an end of
the stored epoch below the offset means an unclean election truncated records the query already read.
With ``failOnDataLoss=true`` the query fails with a clear error; with ``false`` the truncation is logged,
counted (``SluiceStreamReader.truncations``) and the query reads on from the new leader's end of that
epoch: the records there are new ones the query has not seen.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from sluice.client.client import Client
from sluice.errors import InvalidArgument, OffsetOutOfRange
from sluice.spark.options import parse_tp_key, tp_key

log = logging.getLogger(__name__)

__all__ = ["EPOCH", "OFFSET", "check_truncation", "join_offsets", "leader_epochs", "split_offsets"]

OFFSET, EPOCH = "offset", "leaderEpoch"


def split_offsets(raw: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """A streaming offset (either form) -> ``({key: offset}, {key: leader epoch})``."""
    offsets: dict[str, int] = {}
    epochs: dict[str, int] = {}
    for key, value in raw.items():
        if isinstance(value, int) and not isinstance(value, bool):
            offsets[key] = value
            continue
        if isinstance(value, Mapping):
            offset, epoch = value.get(OFFSET), value.get(EPOCH, -1)
            if isinstance(offset, int) and isinstance(epoch, int):
                offsets[key] = offset
                if epoch >= 0:
                    epochs[key] = epoch
                continue
        raise InvalidArgument(
            f"offset of {key} is neither a number nor {{{OFFSET!r}: n, {EPOCH!r}: e}}: {value!r}"
        )
    return offsets, epochs


def join_offsets(offsets: Mapping[str, int], epochs: Mapping[str, int]) -> dict[str, Any]:
    """The streaming offset Spark checkpoints: with an epoch where one is known."""
    return {
        key: {OFFSET: offset, EPOCH: epochs[key]} if epochs.get(key, -1) >= 0 else offset
        for key, offset in offsets.items()
    }


def leader_epochs(client: Client, keys: Iterable[str]) -> dict[str, int]:
    """The partitions' leader epochs now (read after their offsets were listed: module docstring)."""
    wanted = [parse_tp_key(k) for k in keys]
    md = client.metadata(sorted({t for t, _ in wanted}), refresh=True)
    return {tp_key(t, p): e for t, p in wanted if (e := md.leader_epoch(t, p)) >= 0}


def check_truncation(
    client: Client, offsets: Mapping[str, int], epochs: Mapping[str, int], fail_on_data_loss: bool
) -> tuple[dict[str, int], list[tuple[str, int, int]]]:
    """``offsets`` checked with their partitions' current leaders; returns them (lower where records were
    truncated, with ``failOnDataLoss=false``) and the truncations found: ``(key, offset, new offset)``."""
    asks = {parse_tp_key(k): (o, epochs[k]) for k, o in offsets.items() if k in epochs}
    out = dict(offsets)
    found: list[tuple[str, int, int]] = []
    if not asks:
        return out, found
    for (topic, partition), checked in client.check_positions(asks).items():
        key = tp_key(topic, partition)
        offset = offsets[key]
        if checked >= offset:
            continue
        msg = (
            f"records {checked}..{offset - 1} of {key}, which the query already read in leader epoch "
            f"{epochs[key]}, are not in the current leader's log: an unclean leader election truncated them "
            f"(the new leader's records take their offsets)"
        )
        if fail_on_data_loss:
            raise OffsetOutOfRange(msg + f" (set failOnDataLoss=false to log it and read on from {checked})")
        log.warning("%s; reading on from %d (failOnDataLoss=false)", msg, checked)
        out[key] = checked
        found.append((key, offset, checked))
    return out, found
