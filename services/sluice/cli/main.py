"""``sluice``: one command, a sub-command per service and per user task.

Service sub-commands (what the containers run) are dispatched to each service's
own ``main(argv)`` so they own their flags; user sub-commands live in
``sluice.cli.commands``.
"""

from __future__ import annotations

import importlib
import sys

# sub-command -> module whose main(argv) runs it.
SERVICES = {
    "broker": "sluice.broker.main",
    "coordinator": "sluice.coordinator.main",
    "offset-store": "sluice.offsetstore.main",
    "dispatcher": "sluice.dispatcher.main",
}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:2] == ["broker", "verify"]:  # an offline tool on a broker's data, not the broker service
        if not _server_installed("sluice broker verify"):
            return 1
        verify = importlib.import_module("sluice.cli.broker_verify")
        return int(verify.main(args[2:]))
    if args[:1] == ["scheduler"]:  # delayed delivery (docs/delayed-delivery.md); no config class yet
        scheduler = importlib.import_module("sluice.broker.schedule.main")
        return int(scheduler.main(args[1:]))
    if args and args[0] in SERVICES:
        if not _server_installed(f"sluice {args[0]}"):
            return 1
        module = importlib.import_module(SERVICES[args[0]])
        return int(module.main(args[1:]))
    commands = importlib.import_module("sluice.cli.commands")
    return int(commands.main(args))


def _server_installed(what: str) -> bool:
    """False (having said what to install) on a slim ``pip install sluice`` (no ``[server]``)."""
    from sluice.cli.server_extra import require_server
    from sluice.errors import SluiceError

    try:
        require_server(what)
    except SluiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return False
    return True
