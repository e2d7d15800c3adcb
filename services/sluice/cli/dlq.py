"""``sluice dlq list|peek|purge|redrive``: the dead-letter topics of pull groups and push subscriptions
(docs/retry.md).

``redrive`` is ``dlq_redrive.py``; this module parses, confirms and prints.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from sluice.cli.connect import connect
from sluice.cli.dlq_redrive import (
    DEFAULT_CAP,
    RedriveOptions,
    RedriveProgress,
    Redriver,
    cursor_of,
    redelivery_of,
)
from sluice.cli.errors import UsageError
from sluice.retry.levels import DLQ_PREFIX, SUB_DLQ_SUFFIX, dlq_group, dlq_topic, retry_info, sub_dlq_topic

__all__ = ["add_parser"]


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    dlq = subparsers.add_parser(
        "dlq",
        help="dead-letter topics of pull groups and push subscriptions: list, peek, purge, redrive",
        parents=[common],
    )
    actions = dlq.add_subparsers(dest="action", metavar="ACTION", required=True)

    lst = actions.add_parser("list", help="DLQ topics, their records and redrive cursors", parents=[common])
    lst.set_defaults(run=run_list, parser=lst)

    peek = actions.add_parser("peek", help="show dead letters from the redrive cursor on", parents=[common])
    _add_source(peek)
    peek.add_argument("-n", "--count", type=int, default=10, help="records to show (default 10)")
    peek.set_defaults(run=run_peek, parser=peek)

    purge = actions.add_parser(
        "purge", help="drop every dead letter of a group or subscription (asks first)", parents=[common]
    )
    _add_source(purge)
    purge.add_argument("--yes", action="store_true", help="do not ask")
    purge.set_defaults(run=run_purge, parser=purge)

    redrive = actions.add_parser(
        "redrive",
        help="move dead letters back (by default only to the group or subscription that failed)",
        parents=[common],
    )
    _add_source(redrive)
    redrive.add_argument(
        "--to",
        choices=("retry", "redelivery", "original"),
        default=None,
        help="retry (groups) / redelivery (subscriptions): only the one that failed sees them again "
        "(the default); original: every group and subscription of the topic",
    )
    redrive.add_argument("--filter", default="*", help="tag expression, as subscriptions use (default *)")
    redrive.add_argument("--rate", default="0", help="records per second, e.g. 500/s (default: unthrottled)")
    redrive.add_argument(
        "--cap", type=int, default=DEFAULT_CAP, help=f"redrives per record (default {DEFAULT_CAP})"
    )
    redrive.add_argument("--dry-run", action="store_true", help="count what would move; write nothing")
    redrive.add_argument("--yes", action="store_true", help="do not ask (needed for --to original)")
    redrive.set_defaults(run=run_redrive, parser=redrive)


def _add_source(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--group", "-g", help="the pull group whose DLQ.<group> to use")
    src.add_argument("--subscription", help="a push subscription (with --topic): its <topic>.<sub>.DLQ")
    src.add_argument("--dlq-topic", help="the dead-letter topic by name (DLQ.<group>)")
    parser.add_argument("--topic", help="the topic of --subscription")


def _source(args: argparse.Namespace) -> RedriveOptions:
    """The DLQ the arguments name, as redrive options (the redrive's own fields left at defaults)."""
    if args.subscription:
        if not args.topic:
            raise UsageError("--subscription needs --topic (the subscription's topic)")
        name = sub_dlq_topic(args.topic, args.subscription)
        return RedriveOptions(dlq=name, to="redelivery", topic=args.topic, subscription=args.subscription)
    if args.topic:
        raise UsageError("--topic goes with --subscription only")
    if args.dlq_topic:
        dlq_group(args.dlq_topic)  # NotADlqTopic for anything else
        return RedriveOptions(dlq=str(args.dlq_topic))
    return RedriveOptions(dlq=dlq_topic(args.group))


def _dlq_of(args: argparse.Namespace) -> str:
    return _source(args).dlq


def _confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"{question}: pass --yes to confirm (stdin is not a terminal)")
    answer = input(f"{question} Type 'yes' to go on: ")
    if answer.strip() != "yes":
        raise UsageError("not confirmed; nothing changed")


def run_list(args: argparse.Namespace) -> int:
    with connect(args) as client:
        names = sorted(
            t.name
            for t in client.admin.list_topics()
            if t.name.startswith(DLQ_PREFIX) or t.name.endswith(SUB_DLQ_SUFFIX)
        )
        rows = [("DLQ", "RECORDS", "REDRIVE-CURSOR")]
        for name in names:
            start = client.list_offsets(name, "earliest")
            end = client.list_offsets(name, "latest")
            cursor = client.admin.group_offsets(cursor_of(name))
            at = sum(max(cursor.get((name, p), start[p]), start[p]) for p in end)
            rows.append((name, str(sum(end[p] - start[p] for p in end)), f"{at}/{sum(end.values())}"))
    for row in rows:
        print(f"{row[0]:<40} {row[1]:>10} {row[2]:>20}")
    return 0


def run_peek(args: argparse.Namespace) -> int:
    name = _dlq_of(args)  # usage errors before the count's
    if args.count < 1:
        raise UsageError(f"--count must be >= 1, got {args.count}")
    with connect(args) as client:
        source = _source(args)
        source.dry_run = True
        redriver = Redriver(client, source, lambda _p: None)
        positions = redriver.cursor()
        shown = 0
        with client.fetcher({(name, p): o for p, o in positions.items()}, max_wait_ms=100) as f:
            deadline = time.monotonic() + 2.0
            while shown < args.count and time.monotonic() < deadline:
                for r in f.fetch(0.3):
                    if shown >= args.count:
                        break
                    info = retry_info(r.headers)
                    where = f"from {info.topic}[{info.partition}]@{info.offset} x{info.count}" if info else ""
                    print(f"{name}[{r.partition}]@{r.offset} {where} key={r.key!r} value={r.value[:80]!r}")
                    shown += 1
    return 0


def run_purge(args: argparse.Namespace) -> int:
    name = _dlq_of(args)
    with connect(args) as client:
        info = client.admin.describe_topic(name)
        _confirm(f"purge drops every record of {name}.", args.yes)
        # No delete-records in the broker yet: the topic is deleted and made again (a new topic id).
        client.admin.delete_topic(name)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.admin.create_topic(name, partitions=len(info.partitions))
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # the delete completes on the brokers asynchronously
    print(f"purged {name}")
    return 0


def _rate(text: str) -> float:
    raw = text.removesuffix("/s")
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"--rate must be a number of records per second like 500/s, got {text!r}") from None
    if value < 0:
        raise UsageError(f"--rate must be >= 0, got {text!r}")
    return value


def run_redrive(args: argparse.Namespace) -> int:
    opts = _source(args)
    name = opts.dlq
    opts.to = args.to or opts.to
    opts.tag_filter = args.filter
    opts.rate = _rate(args.rate)
    opts.cap = args.cap
    opts.dry_run = args.dry_run
    redelivery_of(opts)  # bad options fail before connecting or asking
    if opts.to == "original" and not opts.dry_run:
        _confirm(
            f"--to original writes the dead letters of {name} back to their original topics: EVERY group "
            "and subscription reading those topics sees them again, not only the one that failed.",
            args.yes,
        )
    last = [0.0]

    def report(p: RedriveProgress) -> None:
        now = time.monotonic()
        if now - last[0] >= 1.0 or p.read >= p.total:
            last[0] = now
            print(
                f"{'would redrive' if opts.dry_run else 'redriven'} {p.redriven}, read {p.read}/{p.total}, "
                f"deduplicated {p.deduplicated}, kept (cap) {p.kept}, filtered {p.filtered}",
                file=sys.stderr,
                flush=True,
            )

    with connect(args) as client:
        done = Redriver(client, opts, report).run()
    verb = "dry run: would redrive" if opts.dry_run else "redrove"
    print(f"{verb} {done.redriven} of {done.total} from {name}")
    return 0
