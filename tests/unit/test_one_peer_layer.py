"""One peer layer (issue 13): one channel cache, one ListOffsets planner, one backoff.

A scan of every module under ``services/sluice``: only ``common/peers.py`` creates a gRPC channel, only
``common/list_offsets.py`` calls a ListOffsets stub or builds a ListOffsets request, and only
``common/backoff.py`` defines a backoff class. A copy that comes back fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.test_error_decoding import hand_decoding

SLUICE = Path(__file__).resolve().parents[2] / "services" / "sluice"

CHANNEL_FACTORIES = {"insecure_channel", "secure_channel", "intercept_channel"}
PEERS = "common/peers.py"
PLANNER = "common/list_offsets.py"
BACKOFF = "common/backoff.py"


def _called_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def findings(source: str) -> dict[str, list[int]]:
    """What in ``source`` belongs to the peer layer only: kind -> line numbers."""
    found: dict[str, list[int]] = {"channel": [], "list_offsets": [], "backoff": []}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = _called_name(node)
            if name in CHANNEL_FACTORIES:
                found["channel"].append(node.lineno)
            elif name in ("ListOffsets", "ListOffsetsRequest", "ListOffsetsPartition"):
                found["list_offsets"].append(node.lineno)
        elif isinstance(node, ast.ClassDef) and "backoff" in node.name.lower():
            found["backoff"].append(node.lineno)
    return found


def test_the_scan_finds_what_it_forbids() -> None:
    assert findings("ch = grpc.aio.insecure_channel(a, options=o)\n")["channel"] == [1]
    assert findings("from grpc import insecure_channel\nx = insecure_channel(a)\n")["channel"] == [2]
    assert findings("r = await stub.ListOffsets(req, timeout=1)\n")["list_offsets"] == [1]
    assert findings("r = broker_pb2.ListOffsetsRequest()\n")["list_offsets"] == [1]
    assert findings("class ReconnectBackoff:\n    pass\n")["backoff"] == [1]
    assert findings("async def ListOffsets(self, request, context):\n    pass\n") == {
        "channel": [],
        "list_offsets": [],
        "backoff": [],
    }


def test_one_channel_cache_one_planner_one_backoff() -> None:
    owners = {"channel": PEERS, "list_offsets": PLANNER, "backoff": BACKOFF}
    offenders: dict[str, list[str]] = {kind: [] for kind in owners}
    seen: dict[str, bool] = dict.fromkeys(owners, False)
    for path in sorted(SLUICE.rglob("*.py")):
        relative = path.relative_to(SLUICE).as_posix()
        if relative.startswith("v1/"):
            continue  # generated stubs
        for kind, lines in findings(path.read_text()).items():
            if not lines:
                continue
            if relative == owners[kind]:
                seen[kind] = True
            else:
                offenders[kind] += [f"{relative}:{line}" for line in lines]
    assert offenders == {kind: [] for kind in owners}, "use sluice.common.peers / list_offsets / backoff"
    assert seen == dict.fromkeys(owners, True)  # the scan does look at the owners


#: Service modules that talk to peers: they decode errors through the one decoder, like the SDK does
#: (tests/unit/test_error_decoding.py scans the SDK packages whole).
PEER_CALLERS = (
    "common/peers.py",
    "common/list_offsets.py",
    "broker/coordinator_link.py",
    "coordinator/broker_updates.py",
    "coordinator/election/forward.py",
    "coordinator/groups/lag.py",
    "dispatcher/cluster.py",
    "offsetstore/resolver.py",
)


def test_peer_callers_decode_errors_through_the_one_decoder() -> None:
    offenders = {m: hand_decoding((SLUICE / m).read_text()) for m in PEER_CALLERS}
    assert {m: found for m, found in offenders.items() if found} == {}
