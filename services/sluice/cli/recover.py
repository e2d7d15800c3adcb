"""``sluice topic recover TOPIC PARTITION``: bring back an offline partition whose last eligible replicas
never return, electing the most complete log among the replicas that are back (data loss: it says what
may be lost and asks before anything changes). docs/replication.md, "Operator recovery".
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from sluice.cli.connect import connect

if TYPE_CHECKING:  # a type only: `sluice --help` must not load the SDK
    from sluice.client.reassign_admin import Recovery

__all__ = ["add_parser"]


def add_parser(actions: Any, common: argparse.ArgumentParser) -> None:
    recover = actions.add_parser(
        "recover",
        help="elect the most complete returned replica of an offline partition whose eligible ones are gone",
        parents=[common],
    )
    recover.add_argument("name", metavar="TOPIC")
    recover.add_argument("partition", metavar="PARTITION", type=int)
    recover.add_argument("--dry-run", action="store_true", help="say who would lead and what is lost, only")
    recover.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    recover.add_argument("--format", "-f", choices=("text", "json"), default="text", help="output format")
    recover.set_defaults(run=run_recover, parser=recover)


def run_recover(args: argparse.Namespace) -> int:
    with connect(args) as client:
        plan = client.admin.recover_partition(args.name, args.partition, dry_run=True)
        if args.dry_run or not args.yes:
            _show(args, plan)
        if args.dry_run:
            return 0
        if not args.yes and not _confirmed(args):
            print("Nothing changed.", file=sys.stderr)
            return 1
        done = client.admin.recover_partition(args.name, args.partition)
    _show(args, done)
    return 0


def _confirmed(args: argparse.Namespace) -> bool:
    where = f"{args.name}/{args.partition}"
    try:
        answer = input(f"Type {where} to elect this leader and accept the loss: ")
    except EOFError:
        return False
    return answer.strip() == where


def _show(args: argparse.Namespace, plan: Recovery) -> None:
    where = f"{args.name}/{args.partition}"
    if args.format == "json":
        doc = {
            "topic": args.name,
            "partition": args.partition,
            "leader": plan.leader,
            "leader_epoch": plan.leader_epoch,
            "recovered": plan.recovered,
            "missing": list(plan.missing),
            "candidates": [
                {
                    "broker": c.broker_id,
                    "last_leader_epoch": c.last_leader_epoch,
                    "log_end_offset": c.log_end_offset,
                    "damaged": c.damaged,
                }
                for c in plan.candidates
            ],
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    verb = "Elected" if plan.recovered else "Would elect"
    print(f"{where}: {verb} broker {plan.leader} at leader epoch {plan.leader_epoch}.")
    for c in plan.candidates:
        damaged = ", damaged" if c.damaged else ""
        end, epoch = c.log_end_offset, c.last_leader_epoch
        print(f"  broker {c.broker_id}: log end {end} at leader epoch {epoch}{damaged}")
    if not plan.candidates:
        print(f"  broker {plan.leader}: back after a clean shutdown (its log length is not known)")
    if plan.missing:
        print(
            f"  Gone: broker(s) {list(plan.missing)}. What they held beyond broker {plan.leader}'s log is "
            "lost, acknowledged records included; if they return they truncate to it."
        )
