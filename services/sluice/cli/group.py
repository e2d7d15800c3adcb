"""``sluice group list|describe|config`` (``reset-offsets`` and ``delete``: ``group_offsets.py``;
``consume --group``: ``consume.py``).

Groups are administered through ``client.admin`` (coordinator for membership and
config, offset store for committed offsets).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from sluice.cli import group_offsets, group_parked
from sluice.cli.connect import connect
from sluice.cli.errors import UsageError

ASSIGNORS = ("sticky", "range", "round-robin", "averagely", "averagely-by-circle", "consistent-hash")


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    group = subparsers.add_parser(
        "group",
        help="consumer groups: list, describe, config, reset-offsets, delete, parked, unpark",
        parents=[common],
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)

    lst = actions.add_parser("list", help="list consumer groups", parents=[common])
    _add_format(lst)
    lst.set_defaults(run=run_list, parser=lst)

    describe = actions.add_parser(
        "describe", help="members, subscriptions, conflicts, assignment, offsets and lag", parents=[common]
    )
    describe.add_argument("group", metavar="G")
    _add_format(describe)
    describe.set_defaults(run=run_describe, parser=describe)

    config = actions.add_parser(
        "config", help="set a group's conflict policy, assignor and timeouts", parents=[common]
    )
    config.add_argument("group", metavar="G")
    config.add_argument(
        "--conflict-policy",
        choices=("reject", "split"),
        help="members reading one topic with different filters: reject the newer one (default) or "
        "give each filter its own offset track",
    )
    config.add_argument("--assignor", metavar="NAME", help=f"one of {', '.join(ASSIGNORS)}")
    config.add_argument("--session-timeout", metavar="DURATION", help="e.g. 45s")
    config.add_argument("--heartbeat-interval", metavar="DURATION", help="e.g. 3s")
    config.add_argument("--rebalance-timeout", metavar="DURATION", help="e.g. 60s")
    _add_format(config)
    config.set_defaults(run=run_config, parser=config)

    group_offsets.add_parsers(actions, common, _add_format)
    group_parked.add_parsers(actions, common, _add_format)


def _add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", "-f", choices=("text", "json"), default="text", help="output format")


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _partition_list(text: str) -> list[int]:
    try:
        parts = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected partitions like 0,1,2, got {text!r}") from None
    if not parts or any(p < 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected partitions >= 0 like 0,1,2, got {text!r}")
    return parts


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


def _table(rows: Sequence[tuple[str, ...]], indent: str = "  ") -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


# ---- list / describe / config / reset ---------------------------------------------------------------


def run_list(args: argparse.Namespace) -> int:
    with connect(args) as client:
        groups = client.admin.list_groups()
    if args.format == "json":
        _print_json([{"group": g.group, "state": g.state, "members": g.members} for g in groups])
        return 0
    if groups:
        _table([("GROUP", "STATE", "MEMBERS")] + [(g.group, g.state, str(g.members)) for g in groups], "")
    return 0


def describe_to_dict(d: Any) -> dict[str, Any]:
    def parts(items: list[Any]) -> list[dict[str, Any]]:
        return [
            {"topic": a.topic, "partition": a.partition, "track": a.track, "filter": a.filter} for a in items
        ]

    return {
        "group": d.group,
        "state": d.state,
        "group_epoch": d.group_epoch,
        "config": {
            "conflict_policy": d.config.conflict_policy,
            "assignor": d.config.assignor or None,
            "session_timeout_ms": d.config.session_timeout_ms or None,
            "heartbeat_interval_ms": d.config.heartbeat_interval_ms or None,
            "rebalance_timeout_ms": d.config.rebalance_timeout_ms or None,
        },
        "members": [
            {
                "member_id": m.member_id,
                "instance_id": m.instance_id or None,
                "client_id": m.client_id,
                "member_epoch": m.member_epoch,
                "subscription": m.subscription,
                "assigned": parts(m.assigned),
                "pending_revocation": parts(m.pending_revocation),
            }
            for m in d.members
        ],
        "conflicts": d.conflicts,
        # Every (topic, filter) -> track binding, idle ones included, with the handover that started it.
        "tracks": [
            {
                "topic": t.topic,
                "filter": t.filter,
                "track": t.track,
                "members": t.members,
                "idle_since_ms": t.idle_since_ms or None,
                "source_track": t.source_track or None,
                "inherited_filter": t.inherited_filter or None,
                "since_ms": t.since_ms or None,
                "handover_offsets": {str(p): o for p, o in t.handover_offsets.items()},
            }
            for t in d.tracks
        ],
        "offsets": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "track": p.track,
                "committed": p.committed if p.committed >= 0 else None,
                "high_watermark": p.high_watermark,
                "lag": p.lag,
                "lag_seconds": p.lag_ms / 1000 if p.lag_ms >= 0 else None,
                "first_unconsumed_timestamp": (
                    p.first_unconsumed_timestamp if p.first_unconsumed_timestamp >= 0 else None
                ),
                "member_id": p.member_id or None,
            }
            for p in d.lag
        ],
    }


def run_describe(args: argparse.Namespace) -> int:
    with connect(args) as client:
        d = client.admin.describe_group(args.group)
    if args.format == "json":
        _print_json(describe_to_dict(d))
        return 0
    cfg = d.config
    print(f"Group:      {d.group}")
    print(f"State:      {d.state}  (group epoch {d.group_epoch})")
    print(f"Config:     conflict_policy={cfg.conflict_policy} assignor={cfg.assignor or '(default)'}")
    print(f"Members:    {len(d.members)}")
    for m in d.members:
        who = f"  {m.member_id}  epoch {m.member_epoch}  client {m.client_id or '-'}"
        print(who + (f"  instance {m.instance_id}" if m.instance_id else ""))
        subs = ", ".join(f"{t}: {f!r}" for t, f in m.subscription.items())
        print(f"    subscription: {subs}")
        print(f"    assigned:     {_partitions(m.assigned)}")
        if m.pending_revocation:
            print(f"    revoking:     {_partitions(m.pending_revocation)}")
    if d.conflicts:
        print("Conflicts:")
        for line in d.conflicts:
            print(f"  {line}")
    print("Offsets:")
    rows = [("TOPIC", "PARTITION", "TRACK", "COMMITTED", "END", "LAG", "LAG-TIME", "OWNER")]
    for p in d.lag:
        committed = str(p.committed) if p.committed >= 0 else "-"
        rows.append(
            (
                p.topic,
                str(p.partition),
                p.track,
                committed,
                str(p.high_watermark),
                str(p.lag),
                _seconds(p.lag_ms),
                p.member_id or "-",
            )
        )
    if len(rows) > 1:
        _table(rows)
    else:
        print("  (none)")
    return 0


def _seconds(ms: int) -> str:
    """Lag in time for people: 0s, 42.5s, 15m03s, 2h05m, 3d04h; ``?`` when unknown."""
    if ms < 0:
        return "?"
    if ms < 60_000:
        return f"{ms / 1000:.3g}s" if ms < 10_000 else f"{ms // 1000}s"
    s = ms // 1000
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _partitions(items: list[Any]) -> str:
    if not items:
        return "(none)"
    return " ".join(
        f"{a.topic}[{a.partition}]" + (f"@{a.track}" if a.track != "default" else "") for a in items
    )


def run_config(args: argparse.Namespace) -> int:
    settings = (
        args.conflict_policy,
        args.assignor,
        args.session_timeout,
        args.heartbeat_interval,
        args.rebalance_timeout,
    )
    if all(s is None for s in settings):
        raise UsageError("give at least one setting (--conflict-policy, --assignor or a timeout)")
    with connect(args) as client:
        cfg = client.admin.set_group_config(
            args.group,
            conflict_policy=args.conflict_policy,
            assignor=args.assignor,
            session_timeout=args.session_timeout,
            heartbeat_interval=args.heartbeat_interval,
            rebalance_timeout=args.rebalance_timeout,
        )
    doc = {
        "group": args.group,
        "conflict_policy": cfg.conflict_policy,
        "assignor": cfg.assignor or None,
        "session_timeout_ms": cfg.session_timeout_ms or None,
        "heartbeat_interval_ms": cfg.heartbeat_interval_ms or None,
        "rebalance_timeout_ms": cfg.rebalance_timeout_ms or None,
    }
    if args.format == "json":
        _print_json(doc)
    else:
        print(" ".join(f"{k}={'(default)' if v is None else v}" for k, v in doc.items()))
    return 0
