"""Options of the ``sluice`` Spark source, parsed and validated once.

Parsing is pure so that bad options fail at planning time with a typed error
(``InvalidArgument``) and a message naming the option.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sluice.codec.filter import parse_filter, sql_expression
from sluice.common.client_security import TLSConfig
from sluice.common.names import validate_group, validate_topic
from sluice.errors import InvalidArgument

EARLIEST = "earliest"
LATEST = "latest"

#: A position spec: "earliest", "latest", or explicit offsets per "topic/partition".
OffsetSpec = str | dict[str, int]

KNOWN = {
    "bootstrap",
    "topic",
    "startingoffsets",
    "endingoffsets",
    "filter",
    "filtertype",
    "maxrecordsperpartition",
    "maxrecordspertrigger",
    "failondataloss",
    "committogroup",
    "requesttimeoutms",
    "path",
    # TLS and the token, as the SDK's TLSConfig and token= (unset: SLUICE_TLS_* / SLUICE_TOKEN on
    # the driver and the executors, docs/security.md).
    "tlsca",
    "tlscert",
    "tlskey",
    "tlsservername",
    "token",
    # Credentials, as the SDK's token_file=, username= and password= (docs/security.md, "Clients:
    # credentials in the SDK, CLI and Spark").
    "tokenfile",
    "username",
    "password",
    # Kafka-source options (docs/spark.md, "Options").
    "startingtimestamp",
    "startingoffsetsbytimestamp",
    "minpartitions",
    "includeheaders",
}


@dataclass(frozen=True)
class SourceOptions:
    bootstrap: str
    topics: tuple[str, ...]
    starting: OffsetSpec
    ending: OffsetSpec
    filter: str
    max_records_per_partition: int | None
    max_records_per_trigger: int | None
    fail_on_data_loss: bool
    commit_to_group: str | None
    request_timeout_s: float
    tls: TLSConfig | None = None
    token: str | None = None
    token_file: str | None = None
    username: str | None = None
    password: str | None = None
    #: startingTimestamp (ms): every partition starts at its first record at or after it.
    starting_timestamp: int | None = None
    #: startingOffsetsByTimestamp: "topic/partition" -> ms; wins over startingTimestamp/Offsets.
    starting_by_timestamp: dict[str, int] | None = None
    #: minPartitions: at least this many Spark partitions, large ranges split in proportion.
    min_partitions: int | None = None
    #: includeHeaders: the ``headers`` column (Kafka's default: off).
    include_headers: bool = False

    def client_kwargs(self) -> dict[str, Any]:
        """The security arguments of every ``Client`` the source makes, on the driver and executors."""
        return {
            "tls": self.tls,
            "token": self.token,
            "token_file": self.token_file,
            "username": self.username,
            "password": self.password,
        }

    def __repr__(self) -> str:  # Spark logs plans: never the password or the token
        hidden = {"password": "***" if self.password else None, "token": "***" if self.token else None}
        fields = {f: getattr(self, f) for f in self.__dataclass_fields__}
        return f"SourceOptions({', '.join(f'{k}={hidden.get(k, v)!r}' for k, v in fields.items())})"


def tp_key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def parse_tp_key(key: str) -> tuple[str, int]:
    topic, sep, part = key.rpartition("/")
    if not sep or not part.isdigit():
        raise InvalidArgument(f"invalid partition key {key!r}: expected 'topic/partition'")
    return topic, int(part)


def _offsets(name: str, raw: str | None, default: str, topics: tuple[str, ...]) -> OffsetSpec:
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip()
    if text in (EARLIEST, LATEST):
        return text
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(
            f"option {name}: {text!r} is neither 'earliest', 'latest' nor JSON like "
            f'{{"topic": {{"0": 42}}}}: {exc.msg}'
        ) from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"option {name}: the JSON must be an object of topic -> {{partition: offset}}")
    out: dict[str, int] = {}
    for topic, parts in data.items():
        if topic not in topics:
            raise InvalidArgument(
                f"option {name}: topic {topic!r} is not among the subscribed topics {topics}"
            )
        if not isinstance(parts, dict):
            raise InvalidArgument(f"option {name}: {topic!r} must map partitions to offsets")
        for part, off in parts.items():
            if not str(part).isdigit() or not isinstance(off, int) or isinstance(off, bool):
                raise InvalidArgument(f"option {name}: {topic}/{part} -> {off!r} is not partition -> offset")
            if off < -2:
                raise InvalidArgument(f"option {name}: offset {off} for {topic}/{part} is negative")
            out[tp_key(topic, int(part))] = off  # -2 earliest, -1 latest, like Kafka
    return out


def _timestamps(raw: str | None, topics: tuple[str, ...]) -> dict[str, int] | None:
    """startingOffsetsByTimestamp: ``{"topic": {"0": 1700000000000}}`` -> {"topic/0": ms}."""
    if raw is None or raw.strip() == "":
        return None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(
            f'option startingOffsetsByTimestamp: not JSON like {{"topic": {{"0": 1700000000000}}}}: {exc.msg}'
        ) from None
    if not isinstance(data, dict):
        raise InvalidArgument("option startingOffsetsByTimestamp: the JSON must be an object of topics")
    out: dict[str, int] = {}
    for topic, parts in data.items():
        if topic not in topics or not isinstance(parts, dict):
            raise InvalidArgument(
                f"option startingOffsetsByTimestamp: {topic!r} must be a subscribed topic mapping "
                "partitions to timestamps (ms)"
            )
        for part, ts in parts.items():
            if not str(part).isdigit() or not isinstance(ts, int) or isinstance(ts, bool) or ts < 0:
                raise InvalidArgument(
                    f"option startingOffsetsByTimestamp: {topic}/{part} -> {ts!r} is not partition -> ms"
                )
            out[tp_key(topic, int(part))] = ts
    return out


def _positive(name: str, raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"option {name}: {raw!r} is not an integer") from None
    if value <= 0:
        raise InvalidArgument(f"option {name}: must be positive, got {value}")
    return value


def _bool(name: str, raw: str | None, default: bool) -> bool:
    if raw is None:
        return default
    low = raw.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise InvalidArgument(f"option {name}: {raw!r} is not a boolean")


def parse_options(options: Mapping[str, str], streaming: bool) -> SourceOptions:
    # Spark lower-cases option keys (CaseInsensitiveMap); accept either spelling.
    opts = {k.lower(): v for k, v in options.items()}
    unknown = set(opts) - KNOWN
    if unknown:
        raise InvalidArgument(f"unknown option(s) for the sluice source: {', '.join(sorted(unknown))}")
    bootstrap = opts.get("bootstrap", "").strip()
    if not bootstrap:
        raise InvalidArgument("option bootstrap is required (the coordinator address, e.g. 127.0.0.1:7600)")
    raw_topics = opts.get("topic") or opts.get("path") or ""
    topics = tuple(t.strip() for t in raw_topics.split(",") if t.strip())
    if not topics:
        raise InvalidArgument("option topic is required (one topic or a comma-separated list)")
    for t in topics:
        validate_topic(t)
    starting = _offsets(
        "startingOffsets", opts.get("startingoffsets"), LATEST if streaming else EARLIEST, topics
    )
    ending = _offsets("endingOffsets", opts.get("endingoffsets"), LATEST, topics)
    if streaming and "endingoffsets" in opts:
        raise InvalidArgument("option endingOffsets applies to batch reads only")
    if ending == EARLIEST:
        raise InvalidArgument("option endingOffsets cannot be 'earliest'")
    flt = opts.get("filter", "*")
    # filterType: "tag" (the default) or "sql" (an SQL92 property filter, docs/filters.md).
    filter_type = opts.get("filtertype", "tag").lower()
    if filter_type not in ("tag", "sql"):
        raise InvalidArgument(f"option filterType must be 'tag' or 'sql', got {filter_type!r}")
    if filter_type == "sql":
        flt = sql_expression(flt)
    parse_filter(flt)
    group = opts.get("committogroup")
    if group is not None:
        validate_group(group)
    timeout_ms = _positive("requestTimeoutMs", opts.get("requesttimeoutms")) or 30_000
    creds = _credentials(opts)
    return SourceOptions(
        bootstrap=bootstrap,
        topics=topics,
        starting=starting,
        ending=ending,
        filter=flt,
        max_records_per_partition=_positive("maxRecordsPerPartition", opts.get("maxrecordsperpartition")),
        max_records_per_trigger=_positive("maxRecordsPerTrigger", opts.get("maxrecordspertrigger")),
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss"), True),
        commit_to_group=group,
        request_timeout_s=timeout_ms / 1000,
        tls=_tls(opts),
        token=creds["token"],
        token_file=creds["token_file"],
        username=creds["username"],
        password=creds["password"],
        starting_timestamp=_millis_option(opts.get("startingtimestamp")),
        starting_by_timestamp=_timestamps(opts.get("startingoffsetsbytimestamp"), topics),
        min_partitions=_positive("minPartitions", opts.get("minpartitions")),
        include_headers=_bool("includeHeaders", opts.get("includeheaders"), False),
    )


def _millis_option(raw: str | None) -> int | None:
    """startingTimestamp: milliseconds since the epoch, or None."""
    if raw is None or not raw.strip():
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"option startingTimestamp: {raw!r} is not milliseconds") from None
    if value < 0:
        raise InvalidArgument(f"option startingTimestamp: must be >= 0, got {value}")
    return value


def _credentials(opts: Mapping[str, str]) -> dict[str, str | None]:
    """``token``, ``tokenFile``, ``username``, ``password``: one kind at a time (the SDK's rule)."""
    found = {
        "token": opts.get("token") or None,
        "token_file": opts.get("tokenfile") or None,
        "username": opts.get("username") or None,
        "password": opts.get("password") or None,
    }
    if found["token"] and found["token_file"]:
        raise InvalidArgument("options token and tokenFile: give one")
    if (found["token"] or found["token_file"]) and (found["username"] or found["password"]):
        raise InvalidArgument("options token/tokenFile and username/password: give one kind")
    if (found["username"] is None) != (found["password"] is None):
        raise InvalidArgument("options username and password go together")
    return found


def _tls(opts: Mapping[str, str]) -> TLSConfig | None:
    """``tlsCa``, ``tlsCert``, ``tlsKey``, ``tlsServerName``: None when none is given."""
    values = {
        "ca": opts.get("tlsca") or None,
        "cert": opts.get("tlscert") or None,
        "key": opts.get("tlskey") or None,
        "server_name": opts.get("tlsservername") or None,
    }
    if not any(values.values()):
        return None
    if (values["cert"] is None) != (values["key"] is None):
        raise InvalidArgument("options tlsCert and tlsKey go together")
    return TLSConfig(**values)
