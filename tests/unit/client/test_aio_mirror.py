"""``sluice.aio`` is the sync SDK awaited, not a second copy of it (issue 18, docs/asyncio.md, "One
implementation underneath"), and it has the sync SDK's names and arguments.

- Its modules reach the cluster only through the sync parts: they import no gRPC, no generated protocol
  code, no socket or wire module, and from the SDK only the public parts and their types. A second
  producer, fetch loop or session inside ``sluice.aio`` would need one of those imports.
- Every public method of a sync part is on the aio part with the same parameters, but for the few
  listed below with the reason each is not (so a method added to the sync SDK without its aio form
  fails here).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from sluice import aio
from sluice.client.client import Client as SyncClient
from sluice.client.consumer import Consumer as SyncConsumer
from sluice.client.fetcher import Fetcher as SyncFetcher
from sluice.client.producer import Producer as SyncProducer
from sluice.client.push import PushConsumer as SyncPushConsumer
from tests.unit.test_import_graph import SERVICES, imported, modules

AIO = SERVICES / "sluice" / "aio"

#: The SDK modules sluice.aio may import: the sync parts it wraps, their configs, results and errors.
ALLOWED_SDK = {
    "sluice.aio",
    "sluice.client.admin",
    "sluice.client.client",
    "sluice.client.consumer",
    "sluice.client.consumer.config",
    "sluice.client.consumer.parker",
    "sluice.client.consumer.retry",
    "sluice.client.fetcher",
    "sluice.client.metadata",
    "sluice.client.offsets",
    "sluice.client.producer",
    "sluice.client.producer.futures",
    "sluice.client.push",
    "sluice.client.push.admin",
    "sluice.client.push.consumer",
    "sluice.codec.batch",
    "sluice.common.client_security",
    "sluice.errors",
}

#: Names the aio modules may take from the allowed modules that also hold encoders or engines.
ALLOWED_NAMES = {
    "sluice.codec.batch": {
        "Record",
        "RecordColumns",
        "Headers",
    },  # the record types, never the encoder or decoder
    "sluice.client.push.consumer": {"TAKE_BATCH"},  # the receive batch size, a constant
    "sluice.client.producer.futures": {"BatchResult"},  # the per-batch outcome the aio futures follow
    "sluice.client.fetcher": {"Fetcher", "AutoOffsetReset", "TopicPartition"},  # the part and its types
}

#: Modules outside sluice that would mean talking to the cluster directly.
TRANSPORTS = {"grpc", "socket", "ssl", "selectors", "google.protobuf", "h2"}


def _aio_modules() -> list[tuple[str, Path, bool]]:
    found = modules(SERVICES).items()
    return [(name, path, pkg) for name, (path, pkg) in found if name.startswith("sluice.aio")]


def test_sluice_aio_imports_only_the_sync_parts_and_no_transport() -> None:
    known = modules(SERVICES)
    problems = []
    for name, path, is_package in _aio_modules():
        tree = ast.parse(path.read_text(), str(path))
        for target in imported(name, is_package, tree, known):
            if target != "sluice.aio" and not target.startswith("sluice.aio.") and target not in ALLOWED_SDK:
                problems.append(f"{name} imports {target}")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in ALLOWED_NAMES and not node.level:
                extra = {a.name for a in node.names} - ALLOWED_NAMES[node.module]
                if extra:
                    problems.append(f"{name} takes {sorted(extra)} from {node.module}")
            roots = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for root in roots:
                if any(root == t or root.startswith(t + ".") for t in TRANSPORTS):
                    problems.append(f"{name} imports {root}: aio reaches the cluster through the sync SDK")
    assert not problems, "\n".join(problems)


#: Public names of a sync part that its aio part does not have, and why.
SYNC_ONLY = {
    SyncClient: {
        "consumer_config": "the helper that merges config and overrides; aio's consumer() calls it",
    },
    SyncConsumer: {},
    SyncFetcher: {
        "fetch_raw": "undecoded batches for the Spark source's Arrow path, which runs in Spark's threads",
        "poll_raw": "the group consumer's fetch driver's hook",
        "on_completion": "the group consumer's fetch driver's hook",
        "wait_answer": "the sync group consumer's poll() reading its own connection (aio never blocks)",
        "arrived": "the sync group consumer's poll() reading its own connection (aio never blocks)",
        "nudge": "the sync group consumer's poll() reading its own connection (aio never blocks)",
    },
    SyncProducer: {"may_block": "the hook sluice.aio asks before sending from the loop's thread"},
    SyncPushConsumer: {
        # The push session's own protocol (the dispatcher stream calls these), not the user's API.
        **dict.fromkeys(
            [
                "address_of",
                "give_back",
                "on_active_change",
                "on_command_error",
                "on_fatal",
                "on_messages",
                "on_session_end",
                "on_subscribed",
                "open_consume",
                "routing_changed",
                "subscribe_request",
            ],
            "the session's internal protocol",
        ),
        "receive_async": "the hook sluice.aio's receive() awaits",
        "receive_many_async": "the hook sluice.aio's receive_many() awaits",
    },
}

PAIRS = [
    (SyncClient, aio.Client),
    (SyncConsumer, aio.Consumer),
    (SyncProducer, aio.Producer),
    (SyncPushConsumer, aio.PushConsumer),
    (SyncFetcher, aio.Fetcher),
]


def _public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


@pytest.mark.parametrize(("sync", "asyncio_part"), PAIRS, ids=[s.__name__ for s, _ in PAIRS])
def test_every_public_sync_method_is_on_the_aio_part_with_the_same_parameters(
    sync: type, asyncio_part: type
) -> None:
    missing = _public(sync) - _public(asyncio_part) - set(SYNC_ONLY[sync])
    assert not missing, f"aio.{asyncio_part.__name__} lacks {sorted(missing)} of the sync {sync.__name__}"
    stale = set(SYNC_ONLY[sync]) - _public(sync)
    assert not stale, f"SYNC_ONLY lists names the sync {sync.__name__} no longer has: {sorted(stale)}"
    for name in sorted(_public(sync) & _public(asyncio_part)):
        ours, theirs = inspect.getattr_static(asyncio_part, name), inspect.getattr_static(sync, name)
        if isinstance(theirs, property) or not callable(theirs):
            continue
        assert list(inspect.signature(getattr(asyncio_part, name)).parameters) == list(
            inspect.signature(getattr(sync, name)).parameters
        ), f"{asyncio_part.__name__}.{name} takes other parameters than the sync one"
        assert callable(ours)


def test_the_aio_client_takes_the_sync_clients_arguments() -> None:
    assert list(inspect.signature(aio.Client).parameters) == list(inspect.signature(SyncClient).parameters)
