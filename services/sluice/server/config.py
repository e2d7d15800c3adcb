"""Service configuration: a dataclass per service, filled from file, env and flags.

Precedence, lowest first: field defaults, a TOML file (``--config``), environment
variables (``SLUICE_<SERVICE>_<FIELD>``, e.g. ``SLUICE_BROKER_DATA_DIR``), then
command-line flags (``--data-dir``). Unknown keys in the file are rejected.
Each field documents itself with ``field(metadata={"help": ...})``; durations
are ``timedelta`` and accept ``250ms``, ``5s``, ``2m``, ``1h``, ``7d``. Values are converted by
``common/settings.py``, the converter the SDK's settings use too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
import typing
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from sluice.codec.filter_limits import FilterLimits
from sluice.common.settings import convert_setting
from sluice.common.units import parse_duration, parse_size
from sluice.errors import InvalidArgument

__all__ = ["ConnectionSettings", "add_arguments", "load", "parse_duration", "parse_size"]

T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """One ``--flag`` per dataclass field, with the field's help text."""
    parser.add_argument("--config", type=Path, help="TOML file with settings (flags and env override it)")
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        default = f.default if f.default is not dataclasses.MISSING else None
        parser.add_argument(
            flag,
            dest=f.name,
            default=None,
            metavar=f.name.upper(),
            help=f"{help_text} (default: {_show(default)}; type: {_type_name(hints[f.name])})",
        )


def _show(value: Any) -> str:
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
    return repr(value)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def load(
    cls: type[T],
    env_prefix: str,
    args: argparse.Namespace | None = None,
    env: typing.Mapping[str, str] | None = None,
) -> T:
    """Build a config from defaults < file < env < flags; reject unknown file keys."""
    env = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    config_file = getattr(args, "config", None) if args is not None else None
    if config_file is not None:
        try:
            data = tomllib.loads(Path(config_file).read_text())
        except (OSError, tomllib.TOMLDecodeError, ValueError, UnicodeDecodeError) as exc:
            # ValueError: a path with a NUL byte (found by tests/unit/fuzz); UnicodeDecodeError: not text.
            raise InvalidArgument(f"cannot read config file {str(config_file)[:200]!r}: {exc}") from None
        unknown = set(data) - names
        if unknown:
            raise InvalidArgument(f"unknown settings in {config_file}: {', '.join(sorted(unknown))}")
        for k, v in data.items():
            values[k] = convert_setting("", k, hints[k], v)
    for name in names:
        key = f"{env_prefix}{name.upper()}"
        if key in env:
            values[name] = convert_setting("", key, hints[name], env[key])
    if args is not None:
        for name in names:
            raw = getattr(args, name, None)
            if raw is not None:
                values[name] = convert_setting("", "--" + name.replace("_", "-"), hints[name], raw)
    return cls(**values)


# ---- connection limits (every listener; docs/limits.md, "Connections") -----------------------------

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True)
class ConnectionSettings:
    """The limits of every listener a service runs: its gRPC server and, for the broker and the
    dispatcher, its wire port. A mixin, as ``SecuritySettings`` is: every service's config inherits
    it, so the flags (``--max-connections``), environment (``SLUICE_BROKER_MAX_CONNECTIONS``) and TOML
    keys are spelled alike everywhere. Kafka's names are given where one exists."""

    max_connections: int = field(
        default=10_000,
        metadata={
            "help": "open connections one listener (the gRPC port, the wire port) takes; past it a new "
            "one is closed at once (Kafka max.connections). Counted before the hello"
        },
    )
    max_connections_per_address: int = field(
        default=2_000,
        metadata={
            "help": "open wire connections from one client address (Kafka max.connections.per.ip); "
            "gRPC: grpcio has no connection hook, so grpc_max_rpcs_per_address bounds one address there"
        },
    )
    grpc_max_rpcs_per_address: int = field(
        default=4_096,
        metadata={
            "help": "RPCs (calls and open streams) one client address may run at once on the gRPC server, "
            "over all its connections: as many as one connection may (grpc_max_concurrent_streams), so "
            "opening more connections gains an address nothing; past it a call fails with LIMIT_EXCEEDED"
        },
    )
    connections_max_idle: timedelta = field(
        default=timedelta(minutes=10),
        metadata={
            "help": "a connection with nothing in flight that received nothing for this long is closed "
            "(Kafka connections.max.idle.ms); gRPC: grpc.max_connection_idle_ms (no RPC open)"
        },
    )
    hello_timeout: timedelta = field(
        default=timedelta(seconds=10),
        metadata={"help": "a wire connection whose hello has not arrived after this long is closed"},
    )
    max_hello_bytes: int = field(
        default=16 * KiB,
        metadata={
            "help": "the largest first frame (the hello, with its credentials) a wire connection may "
            "send: what a client that has not authenticated can make the service buffer"
        },
    )
    frame_timeout: timedelta = field(
        default=timedelta(seconds=60),
        metadata={
            "help": "a wire frame begun must be complete within this long (time the service itself "
            "stopped reading does not count): slow (slowloris) senders are closed"
        },
    )
    max_frame_bytes: int = field(
        default=64 * MiB,
        metadata={
            "help": "the largest wire frame and gRPC message (Kafka socket.request.max.bytes); a larger "
            "declared length is refused before its payload is read"
        },
    )
    grpc_max_concurrent_streams: int = field(
        default=4_096,
        metadata={
            "help": "HTTP/2 streams one gRPC connection may have open (SETTINGS_MAX_CONCURRENT_STREAMS; "
            "Rapid Reset, CVE-2023-44487): a client's further streams wait. Above the SDK's use: one "
            "Client multiplexes the heartbeat stream of every group member on one channel"
        },
    )
    grpc_max_concurrent_rpcs: int = field(
        default=20_000,
        metadata={
            "help": "RPCs the gRPC server runs at once over all connections (maximum_concurrent_rpcs); "
            "past it a call fails with RESOURCE_EXHAUSTED, retriable"
        },
    )
    grpc_max_metadata_bytes: int = field(
        default=16 * KiB,
        metadata={"help": "the largest request metadata (headers) a gRPC call may carry"},
    )
    keepalive_time: timedelta = field(
        default=timedelta(seconds=60),
        metadata={
            "help": "gRPC: ping a connection quiet for this long (a dead client's streams are "
            "then dropped); wire: TCP keepalive idle time"
        },
    )
    keepalive_timeout: timedelta = field(
        default=timedelta(seconds=20),
        metadata={"help": "a keepalive ping unanswered for this long closes the connection"},
    )
    keepalive_min_ping_interval: timedelta = field(
        default=timedelta(seconds=10),
        metadata={
            "help": "gRPC: pings from a client closer together than this are strikes; after "
            "keepalive_max_ping_strikes the connection gets GOAWAY (ENHANCE_YOUR_CALM). The SDK "
            "pings every 30 s"
        },
    )
    keepalive_max_ping_strikes: int = field(
        default=2, metadata={"help": "pings too early tolerated before GOAWAY (0: no limit)"}
    )

    def check_connection_settings(self) -> None:
        """InvalidArgument for a setting no listener can run with."""
        counts = {
            "max_connections": self.max_connections,
            "max_connections_per_address": self.max_connections_per_address,
            "max_hello_bytes": self.max_hello_bytes,
            "grpc_max_concurrent_streams": self.grpc_max_concurrent_streams,
            "grpc_max_concurrent_rpcs": self.grpc_max_concurrent_rpcs,
            "grpc_max_rpcs_per_address": self.grpc_max_rpcs_per_address,
            "grpc_max_metadata_bytes": self.grpc_max_metadata_bytes,
        }
        for name, value in counts.items():
            if value < 1:
                raise InvalidArgument(f"{name} must be >= 1, got {value}")
        if not 16 <= self.max_frame_bytes <= 1 << 31:
            raise InvalidArgument(f"max_frame_bytes must be in [16, 2 GiB], got {self.max_frame_bytes}")
        if self.keepalive_max_ping_strikes < 0:
            strikes = self.keepalive_max_ping_strikes
            raise InvalidArgument(f"keepalive_max_ping_strikes must be >= 0, got {strikes}")
        durations = {
            "connections_max_idle": self.connections_max_idle,
            "hello_timeout": self.hello_timeout,
            "frame_timeout": self.frame_timeout,
            "keepalive_time": self.keepalive_time,
            "keepalive_timeout": self.keepalive_timeout,
            "keepalive_min_ping_interval": self.keepalive_min_ping_interval,
        }
        for name, span in durations.items():
            if span <= timedelta(0):
                raise InvalidArgument(f"{name} must be positive, got {span.total_seconds():g}s")


@dataclass(frozen=True)
class FilterSettings:
    """The limits on filter expressions (tag and SQL92) of the services that parse them: the broker and
    the dispatcher (``codec/filter_limits.py``). A mixin, as ``ConnectionSettings`` is."""

    max_filter_length: int = field(
        default=4096,
        metadata={"help": "the longest filter expression, in characters (an SQL92 one with its prefix)"},
    )
    max_filter_tags: int = field(default=256, metadata={"help": "the most tags one tag filter names"})
    max_filter_depth: int = field(
        default=32, metadata={"help": "the deepest nesting of an SQL92 filter (parentheses, NOT, AND/OR)"}
    )
    max_filter_in_list: int = field(default=1024, metadata={"help": "the most values of one SQL92 IN list"})

    def filter_limits(self) -> FilterLimits:
        """The limits as the parsers take them; InvalidArgument for a limit below 1."""
        limits = {
            "max_filter_length": self.max_filter_length,
            "max_filter_tags": self.max_filter_tags,
            "max_filter_depth": self.max_filter_depth,
            "max_filter_in_list": self.max_filter_in_list,
        }
        for name, value in limits.items():
            if value < 1:
                raise InvalidArgument(f"{name} must be >= 1, got {value}")
        return FilterLimits(*limits.values())
