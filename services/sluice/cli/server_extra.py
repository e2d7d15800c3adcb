"""Whether this installation can run the services: ``pip install sluice`` is the SDK and the CLI's
client commands; the services (and ``sluice up``, which starts them) need ``sluice[server]``.

Checked before anything of a service is imported, so a slim install answers a service command with
one line saying what to install, never an ``ImportError`` traceback from deep inside a service.
"""

from __future__ import annotations

import importlib.util

from sluice.cli.errors import CliError

#: Top-level modules of the ``server`` extra's distributions (pyproject.toml), by distribution.
SERVER_MODULES = {
    "redis": "redis",
    "prometheus-client": "prometheus_client",
    "kubernetes": "kubernetes",
    "grpcio-health-checking": "grpc_health",
    "pyjwt": "jwt",
    "cryptography": "cryptography",
}


def missing_server_packages() -> list[str]:
    """The distributions of ``sluice[server]`` that cannot be imported here (empty: all present)."""
    return [dist for dist, module in SERVER_MODULES.items() if importlib.util.find_spec(module) is None]


def require_server(what: str) -> None:
    """Raise ``SERVER_NOT_INSTALLED`` naming ``what`` and the missing packages, if any."""
    missing = missing_server_packages()
    if missing:
        raise CliError(
            "SERVER_NOT_INSTALLED",
            f"{what} runs Sluice's services, which this installation does not have "
            f"(missing: {', '.join(missing)}). `pip install sluice` is the SDK and the client "
            "commands only; install the services with: pip install 'sluice[server]'",
        )
