"""``sluice topic create|list|describe|delete``: topic administration through ``client.admin``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import Any

from sluice.cli import reassign, recover
from sluice.cli.connect import connect
from sluice.cli.errors import UsageError
from sluice.cli.output import collect_pairs, key_value
from sluice.common.units import parse_size
from sluice.errors import SluiceError
from sluice.v1 import broker_pb2

# The settable per-topic keys are the fields of the wire TopicConfig, so the CLI
# can never drift from what the coordinator accepts.
CONFIG_KEYS = tuple(broker_pb2.TopicConfig.DESCRIPTOR.fields_by_name)


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    topic = subparsers.add_parser(
        "topic", help="create, list, describe, alter and delete topics", parents=[common]
    )
    actions = topic.add_subparsers(dest="action", metavar="ACTION", required=True)

    create = actions.add_parser("create", help="create a topic", parents=[common])
    create.add_argument("name", metavar="NAME")
    create.add_argument("--partitions", "-p", type=int, default=1, help="number of partitions (default 1)")
    create.add_argument(
        "--config",
        "-c",
        type=key_value,
        action="append",
        metavar="KEY=VALUE",
        help=f"topic setting, repeatable; keys: {', '.join(CONFIG_KEYS)}. "
        "*_ms take durations (7d, 12h, 500ms or ms), *_bytes take sizes (1GiB, 64MiB or bytes)",
    )
    create.add_argument(
        "--replication-factor",
        "-r",
        type=int,
        metavar="N",
        help="replicas per partition, on N distinct brokers (default: the coordinator's "
        "--default-replication-factor); more than the live brokers is refused",
    )
    create.add_argument(
        "--min-insync-replicas",
        type=int,
        metavar="M",
        help="in-sync replicas an acks=all write needs (default min(2, N)); at most N",
    )
    create.add_argument(
        "--unclean-leader-election",
        action="store_true",
        help="let an out-of-sync replica lead when no in-sync one is left (loses data; default off)",
    )
    _add_format(create)
    create.set_defaults(run=run_create, parser=create)

    lst = actions.add_parser("list", help="list topic names", parents=[common])
    _add_format(lst)
    lst.set_defaults(run=run_list, parser=lst)

    describe = actions.add_parser(
        "describe", help="partitions, placement, config and offsets", parents=[common]
    )
    describe.add_argument("name", metavar="NAME")
    _add_format(describe)
    describe.set_defaults(run=run_describe, parser=describe)

    alter = actions.add_parser(
        "alter", help="add partitions to a topic, or change its replication settings", parents=[common]
    )
    alter.add_argument("name", metavar="NAME")
    alter.add_argument("--partitions", "-p", type=int, help="the new, larger number of partitions")
    alter.add_argument(
        "--min-insync-replicas", type=int, metavar="M", help="in-sync replicas an acks=all write needs"
    )
    alter.add_argument(
        "--unclean-leader-election",
        choices=("on", "off"),
        help="let an out-of-sync replica lead when no in-sync one is left (loses data)",
    )
    alter.add_argument(
        "--replication-factor",
        "-r",
        type=int,
        metavar="N",
        help="reassign every partition to N replicas (added ones catch up, then the list shrinks)",
    )
    alter.add_argument(
        "--throttle", default="0", metavar="RATE", help="bytes/s each added replica may fetch (e.g. 10MiB)"
    )
    _add_format(alter)
    alter.set_defaults(run=run_alter, parser=alter)

    elect = actions.add_parser(
        "elect-leaders",
        help="give partitions back to their preferred replica (the first of their replicas)",
        parents=[common],
    )
    elect.add_argument("name", metavar="TOPIC", nargs="?", help="one topic (default: every topic)")
    _add_format(elect)
    elect.set_defaults(run=run_elect_leaders, parser=elect)
    reassign.add_parser(actions, common)
    recover.add_parser(actions, common)

    delete = actions.add_parser("delete", help="delete a topic and its data", parents=[common])
    delete.add_argument("name", metavar="NAME")
    delete.set_defaults(run=run_delete, parser=delete)


def _add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", "-f", choices=("text", "json"), default="text", help="output format")


def parse_topic_config(pairs: list[tuple[str, str]] | None) -> dict[str, int | str]:
    """``--config`` pairs as the SDK's config mapping; unknown keys are usage errors.

    The SDK parses durations (``7d``) and sizes (``64MiB``). A bare number is made
    an int here, because the key names its unit: ``retention_ms=1000`` is 1000 ms,
    not the 1000 seconds a bare duration string would mean.
    """
    config: dict[str, int | str] = {}
    for key, raw in collect_pairs(pairs, "--config").items():
        if key not in CONFIG_KEYS:
            raise UsageError(f"unknown topic config {key!r}; known: {', '.join(CONFIG_KEYS)}")
        value = raw.strip()
        config[key] = int(value) if value.isdigit() else value
    return config


def topic_to_dict(info: Any) -> dict[str, Any]:
    return {
        "name": info.name,
        "topic_id": info.topic_id,
        "replication_factor": info.replication_factor,
        "min_insync_replicas": info.min_insync_replicas,
        "unclean_leader_election": info.unclean_leader_election,
        "partitions": [
            {
                "partition": p.partition,
                # The leader, under its old name too: scripts reading broker_id keep working.
                "broker_id": p.broker_id,
                "leader": p.broker_id,
                "replicas": list(p.replicas),
                "isr": list(p.isr),
                "elr": list(p.elr),
                "leader_epoch": p.leader_epoch,
                "adding_replicas": list(p.adding_replicas),
                "removing_replicas": list(p.removing_replicas),
                "dispatcher_id": p.dispatcher_id or None,
            }
            for p in info.partitions
        ],
        "config": dict(info.config),
    }


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")


def _warn(unacknowledged: Iterable[SluiceError]) -> None:
    """A degraded success: the change is recorded, but these brokers have not acknowledged it yet."""
    for err in unacknowledged:
        print(f"warning: {err}", file=sys.stderr)


def run_create(args: argparse.Namespace) -> int:
    config = parse_topic_config(args.config)
    with connect(args) as client:
        info = client.admin.create_topic(
            args.name,
            partitions=args.partitions,
            config=config or None,
            replication_factor=args.replication_factor,
            min_insync_replicas=args.min_insync_replicas,
            unclean_leader_election=args.unclean_leader_election,
        )
    _warn(info.unacknowledged)
    if args.format == "json":
        _print_json(topic_to_dict(info))
    else:
        print(
            f"Created topic {info.name} with {len(info.partitions)} partition(s), replication factor "
            f"{info.replication_factor} (id {info.topic_id})."
        )
    return 0


def run_alter(args: argparse.Namespace) -> int:
    replication = (
        args.min_insync_replicas is not None
        or args.unclean_leader_election is not None
        or args.replication_factor is not None
    )
    if args.partitions is None and not replication:
        raise UsageError(
            "nothing to alter: give --partitions, --replication-factor, --min-insync-replicas or "
            "--unclean-leader-election"
        )
    throttle = parse_size(args.throttle)
    with connect(args) as client:
        if args.partitions is not None:
            info = client.admin.add_partitions(args.name, args.partitions)
            _warn(info.unacknowledged)
        if replication:
            unclean = None if args.unclean_leader_election is None else args.unclean_leader_election == "on"
            info = client.admin.alter_topic(
                args.name,
                min_insync_replicas=args.min_insync_replicas,
                unclean_leader_election=unclean,
                replication_factor=args.replication_factor,
                throttle_bytes_per_second=throttle,
            )
            _warn(info.unacknowledged)
    if args.format == "json":
        _print_json(topic_to_dict(info))
    else:
        print(
            f"Topic {info.name} now has {len(info.partitions)} partition(s), replication factor "
            f"{info.replication_factor}, min in-sync replicas "
            f"{info.min_insync_replicas}, unclean leader election "
            f"{'on' if info.unclean_leader_election else 'off'}."
        )
    return 0


def run_elect_leaders(args: argparse.Namespace) -> int:
    with connect(args) as client:
        elected = client.admin.elect_leaders([args.name] if args.name else [])
    if args.format == "json":
        _print_json([{"topic": t, "partition": p, "leader": b} for t, p, b in elected])
    elif not elected:
        print("Every eligible partition is led by its preferred replica already.")
    else:
        for topic, partition, leader in elected:
            print(f"{topic}/{partition}: leader now broker {leader}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    with connect(args) as client:
        topics = sorted(client.admin.list_topics(), key=lambda t: t.name)
    if args.format == "json":
        _print_json([topic_to_dict(t) for t in topics])
    else:
        for t in topics:
            print(t.name)
    return 0


def run_describe(args: argparse.Namespace) -> int:
    with connect(args) as client:
        info = client.admin.describe_topic(args.name)
        doc = topic_to_dict(info)
        # Offsets come from the leaders (ListOffsets); a broker that is down must not hide the placement
        # the coordinator knows, so they are best effort.
        offsets_error = None
        try:
            start = client.list_offsets(info.name, "earliest")
            hw = client.list_offsets(info.name, "latest")
            leo = client.list_offsets(info.name, "log_end")
        except SluiceError as exc:
            offsets_error, start, hw, leo = str(exc), {}, {}, {}
    for part in doc["partitions"]:
        part["log_start_offset"] = start.get(part["partition"])
        # The high watermark (what consumers may read), under its old name too: scripts reading
        # end_offset keep working. log_end_offset is the leader's log end (above the HW while followers
        # catch up).
        part["high_watermark"] = part["end_offset"] = hw.get(part["partition"])
        part["log_end_offset"] = leo.get(part["partition"])
    if args.format == "json":
        if offsets_error:
            doc["offsets_error"] = offsets_error
        _print_json(doc)
        return 0
    _print_describe(doc)
    if offsets_error:
        print(f"(offsets unavailable: {offsets_error})")
    return 0


def _print_describe(doc: dict[str, Any]) -> None:
    config = " ".join(f"{k}={v}" for k, v in sorted(doc["config"].items()) if v) or "(broker defaults)"
    print(f"Topic:      {doc['name']}")
    print(f"Id:         {doc['topic_id']}")
    print(f"Partitions: {len(doc['partitions'])}")
    print(
        f"Replicas:   {doc['replication_factor']} (min in-sync {doc['min_insync_replicas']}, unclean "
        f"leader election {'on' if doc['unclean_leader_election'] else 'off'})"
    )
    print(f"Config:     {config}")
    moving = any(p["adding_replicas"] or p["removing_replicas"] for p in doc["partitions"])
    header = ("PARTITION", "LEADER", "REPLICAS", "ISR", "EPOCH", "DISPATCHER", "START", "HW", "LEO")
    rows: list[tuple[str, ...]] = [(*header, "ADDING", "REMOVING") if moving else header]
    for part in doc["partitions"]:
        row: tuple[str, ...] = (
            str(part["partition"]),
            str(part["leader"]) if part["leader"] >= 0 else "none",
            ",".join(map(str, part["replicas"])),
            ",".join(map(str, part["isr"])),
            str(part["leader_epoch"]),
            part["dispatcher_id"] or "-",
            _opt(part["log_start_offset"]),
            _opt(part["high_watermark"]),
            _opt(part["log_end_offset"]),
        )
        if moving:
            row = (
                *row,
                ",".join(map(str, part["adding_replicas"])) or "-",
                ",".join(map(str, part["removing_replicas"])) or "-",
            )
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _opt(value: int | None) -> str:
    return "?" if value is None else str(value)


def run_delete(args: argparse.Namespace) -> int:
    with connect(args) as client:
        _warn(client.admin.delete_topic(args.name))
    print(f"Deleted topic {args.name}.")
    return 0
