"""``sluice topic reassign``: move partitions' replicas to other brokers while they serve.

One of: ``TOPIC --partition P --replicas 3,1,2`` (one partition), ``--plan FILE`` (many; the JSON of
``--dry-run``), ``--rebalance`` (spread every topic's replicas and preferred leaders over the live brokers:
after adding a broker), ``--drain BROKER`` (move every replica off a broker: before removing it), or
``--status`` (the reassignments in progress), or ``--cancel`` (back to the original replicas: of
``TOPIC --partition P``, every moving partition of ``TOPIC``, or every one). ``--dry-run`` prints the plan
instead of starting it.
docs/replication.md, "Reassignment".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.cli.connect import connect
from sluice.cli.errors import UsageError
from sluice.common.units import parse_size

if TYPE_CHECKING:  # the plan module loads the SDK's metadata (gRPC): only when a reassign runs
    from sluice.client.reassign_plan import Plan

__all__ = ["add_parser"]


def add_parser(actions: Any, common: argparse.ArgumentParser) -> None:
    reassign = actions.add_parser(
        "reassign",
        help="move partition replicas to other brokers (one partition, a plan file, --rebalance, --drain)",
        parents=[common],
    )
    reassign.add_argument("name", metavar="TOPIC", nargs="?", help="the topic (with --partition)")
    reassign.add_argument("--partition", "-p", type=int, help="the partition to move")
    reassign.add_argument(
        "--replicas", help="target brokers in preference order, comma-separated (e.g. 3,1,2)"
    )
    reassign.add_argument("--plan", type=Path, metavar="FILE", help="a JSON plan (the --dry-run output)")
    reassign.add_argument(
        "--rebalance", action="store_true", help="spread replicas and leaders over all live brokers"
    )
    reassign.add_argument("--drain", type=int, metavar="BROKER", help="move every replica off BROKER")
    reassign.add_argument("--status", action="store_true", help="show the reassignments in progress")
    reassign.add_argument(
        "--cancel",
        action="store_true",
        help="cancel reassignments in progress (of TOPIC [-p P]; default all): back to the original replicas",
    )
    reassign.add_argument(
        "--throttle",
        default="0",
        metavar="RATE",
        help="bytes/s each new replica may fetch while catching up (e.g. 10MiB; default 0: unthrottled)",
    )
    reassign.add_argument("--dry-run", action="store_true", help="print the plan as JSON, start nothing")
    reassign.add_argument("--format", "-f", choices=("text", "json"), default="text", help="output format")
    reassign.set_defaults(run=run_reassign, parser=reassign)


def run_reassign(args: argparse.Namespace) -> int:
    from sluice.client.reassign_plan import drain_plan, plan_to_json, rebalance_plan

    modes = [
        bool(args.replicas),
        args.plan is not None,
        args.rebalance,
        args.drain is not None,
        args.status,
        args.cancel,
    ]
    if sum(modes) != 1:
        raise UsageError("give exactly one of --replicas, --plan, --rebalance, --drain, --status or --cancel")
    if args.cancel:
        return _cancel(args)
    throttle = parse_size(args.throttle)
    # A plan given whole is checked before connecting: a usage error never waits for a cluster.
    given = _given_plan(args)
    with connect(args) as client:
        if args.status:
            return _status(client.admin.list_topics(), args.format)
        if given is not None:
            plan = given
        else:
            snap = client.metadata(refresh=True)
            live = sorted(b.broker_id for b in snap.brokers.values() if b.alive)
            topics = [t for t in snap.topics.values() if not args.name or t.name == args.name]
            racks = {b.broker_id: b.rack for b in snap.brokers.values()}
            plan = (
                rebalance_plan(topics, live, racks)
                if args.rebalance
                else drain_plan(topics, live, args.drain, racks)
            )
        if args.dry_run or not plan:
            _print_json(plan_to_json(plan))
            if not plan:
                print("nothing to move", file=sys.stderr)
            return 0
        client.admin.reassign_partitions(plan, throttle_bytes_per_second=throttle)
    if args.format == "json":
        _print_json(plan_to_json(plan))
    else:
        print(f"Started {len(plan)} reassignment(s); follow them with `sluice topic reassign --status`.")
    return 0


def _given_plan(args: argparse.Namespace) -> Plan | None:
    """The plan of ``--replicas`` or ``--plan FILE``; None for the modes that compute one."""
    from sluice.client.reassign_plan import parse_plan

    if args.replicas:
        if not args.name or args.partition is None:
            raise UsageError("--replicas needs TOPIC and --partition")
        try:
            replicas = tuple(int(b) for b in args.replicas.split(","))
        except ValueError as exc:
            raise UsageError(
                f"--replicas takes broker ids separated by commas, got {args.replicas!r}"
            ) from exc
        return {(args.name, args.partition): replicas}
    if args.plan is not None:
        try:
            text = args.plan.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--plan {args.plan}: cannot read it ({exc.__class__.__name__}: {exc})") from exc
        return parse_plan(text)
    return None


def _cancel(args: argparse.Namespace) -> int:
    with connect(args) as client:
        moving = [
            (t.name, p.partition)
            for t in client.admin.list_topics()
            for p in t.partitions
            if (p.adding_replicas or p.removing_replicas)
            and (not args.name or t.name == args.name)
            and (args.partition is None or p.partition == args.partition)
        ]
        if args.name and args.partition is not None and not moving:
            moving = [(args.name, args.partition)]  # the coordinator says why it is not moving
        if moving:
            client.admin.cancel_reassignments(moving)
    if args.format == "json":
        _print_json({"cancelled": [{"topic": t, "partition": p} for t, p in moving]})
    elif not moving:
        print("No reassignment in progress.")
    else:
        print(f"Cancelled {len(moving)} reassignment(s): " + ", ".join(f"{t}/{p}" for t, p in moving))
    return 0


def _status(topics: list[Any], fmt: str) -> int:
    rows = [
        {
            "topic": t.name,
            "partition": p.partition,
            "replicas": list(p.replicas),
            "isr": list(p.isr),
            "adding": list(p.adding_replicas),
            "removing": list(p.removing_replicas),
            "throttle_bytes_per_second": p.throttle_bytes_per_second,
        }
        for t in topics
        for p in t.partitions
        if p.adding_replicas or p.removing_replicas
    ]
    if fmt == "json":
        _print_json({"in_progress": rows})
        return 0
    if not rows:
        print("No reassignment in progress.")
        return 0
    for r in rows:
        waiting = [b for b in r["adding"] if b not in r["isr"]]
        print(
            f"{r['topic']}/{r['partition']}: adding {r['adding']} (catching up: {waiting}), removing "
            f"{r['removing']}, throttle {r['throttle_bytes_per_second']} B/s"
        )
    return 0


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
