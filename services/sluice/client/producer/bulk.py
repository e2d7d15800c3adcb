"""``Producer.send_many``'s checks and grouping: one call's records as columns, by partition.

``send()`` costs about 2.3 us of CPU per record (docs/latency.md, "Where the goals stand"): a Python
call, its checks, a lock, an append per column, a future. ``send_many`` does the same work once per
call and per partition, with list operations that run in C over the call's records: the types are
checked by ``set(map(type, ...))``, the lengths by ``map(len, ...)``, the partitions by
``map(crc32, ...)``, and each partition's records join its batch's columns by ``list +=``
(``BatchBuilder.extend``). A Python step per record is left only where the record asks for one:
headers, tags, serializers, keys that are not bytes.

Everything is checked before anything is queued: a call with one bad record is refused whole, with
the typed error send() would raise for it, and queues nothing.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import add, itemgetter, mod
from typing import Any

from sluice.codec.batch import COLUMN_BYTES, NO_KEY, Headers, encode_headers
from sluice.errors import InvalidArgument

__all__ = ["Columns", "as_bytes", "headers_size", "prepare", "split"]

_NONE = type(None)
_NOT_A_LIST = (bytes, bytearray, memoryview, str)


@dataclass(slots=True)
class Columns:
    """One call's records (or one partition's share of them), checked and measured."""

    values: list[bytes]
    #: None: no record has a key.
    keys: list[bytes | None] | None
    value_lengths: list[int]
    #: ``NO_KEY`` where a record has no key; None with ``keys``.
    key_lengths: list[int] | None
    #: Each record's encoded size as ``BatchBuilder.append`` counts it (tags aside).
    sizes: list[int]
    #: Each record's encoded headers (b"" for none); None: no record has headers.
    headers: list[bytes] | None = None
    #: The headers as given (for the batch's header summary), with ``headers``.
    header_dicts: list[Headers | None] | None = None
    tags: list[str | None] | None = None

    def pairs(self) -> set[tuple[str, bytes]]:
        """Every distinct (header name, value) of these records: what their batch's summary lists,
        exactly (a pair of a record in another batch would make the summary claim what it lacks)."""
        if self.header_dicts is None:
            return set()
        return {pair for h in self.header_dicts if h for pair in h.items()}

    def pick(self, index: list[int]) -> Columns:
        """The records at ``index`` (in that order)."""
        get = _picker(index)
        return Columns(
            get(self.values),
            None if self.keys is None else get(self.keys),
            get(self.value_lengths),
            None if self.key_lengths is None else get(self.key_lengths),
            get(self.sizes),
            None if self.headers is None else get(self.headers),
            None if self.header_dicts is None else get(self.header_dicts),
            None if self.tags is None else get(self.tags),
        )

    def cut(self, start: int, end: int) -> Columns:
        """Records ``start`` to ``end`` (the whole, uncopied, when that is all of them)."""
        if start == 0 and end == len(self.values):
            return self

        def part(col: list[Any] | None) -> list[Any] | None:
            return None if col is None else col[start:end]

        return Columns(
            self.values[start:end],
            part(self.keys),
            self.value_lengths[start:end],
            part(self.key_lengths),
            self.sizes[start:end],
            part(self.headers),
            part(self.header_dicts),
            part(self.tags),
        )


def _picker(index: list[int]) -> Callable[[list[Any]], list[Any]]:
    """A column's items at ``index``: one ``itemgetter`` built per call and applied to each column, a
    C loop with no call per item (about 8 ns a record and column here, against about 40 for
    ``list(map(col.__getitem__, index))``: docs/latency.md, "Session 15, SDK CPU per record")."""
    if len(index) == 1:  # itemgetter of one index gives the item itself, not a 1-tuple
        only = index[0]
        return lambda col: [col[only]]
    fetch = itemgetter(*index)

    def get(col: list[Any]) -> list[Any]:
        return list(fetch(col))

    return get


def prepare(
    values: Sequence[Any],
    keys: Sequence[Any] | None,
    headers: Sequence[Headers | None] | None,
    tags: Sequence[str | None] | None,
    serialize: Callable[[Any, Any], tuple[bytes, Any]] | None,
    check_tag: Callable[[str], None],
) -> Columns:
    """Check one ``send_many`` call's arguments and measure its records. Raises InvalidArgument
    (SerializationError from a serializer) before anything is queued."""
    if isinstance(values, _NOT_A_LIST) or not isinstance(values, Sequence):
        raise InvalidArgument(f"values must be a list of records' values, got {type(values).__name__}")
    n = len(values)
    for name, col in (("keys", keys), ("headers", headers), ("tags", tags)):
        if col is not None and (not isinstance(col, Sequence) or isinstance(col, _NOT_A_LIST)):
            raise InvalidArgument(f"{name} must be a list (one per value), got {type(col).__name__}")
        if col is not None and len(col) != n:
            raise InvalidArgument(f"{name} has {len(col)} entries for {n} values: give one per value")
    if serialize is not None:
        pairs = list(map(serialize, values, keys if keys is not None else [None] * n))
        values, keys = [p[0] for p in pairs], [p[1] for p in pairs]
    vals = _as_bytes_list(values, "value", allow_none=False)
    value_lengths = list(map(len, vals))
    # Each record's size in one pass at the end: operator.add over repeat() costs less than a bound
    # int.__add__ per record, and the keys' lengths join the values' in the same C loop.
    payload: Iterable[int] = value_lengths
    key_list: list[bytes | None] | None = None
    key_lengths: list[int] | None = None
    if keys is not None:
        key_list = _as_bytes_list(keys, "key", allow_none=True)
        if None in key_list:
            key_lengths = [NO_KEY if k is None else len(k) for k in key_list]
            payload = map(add, value_lengths, (max(k, 0) for k in key_lengths))
        elif key_list:
            key_lengths = list(map(len, key_list))  # type: ignore[arg-type]
            payload = map(add, value_lengths, key_lengths)
        if key_lengths is not None and key_lengths.count(NO_KEY) == n:
            key_list = key_lengths = None  # every key None: as keyless
    sizes = list(map(add, payload, repeat(COLUMN_BYTES)))
    cols = Columns(vals, key_list, value_lengths, key_lengths, sizes)
    if headers is not None and any(headers):
        _add_headers(cols, headers)
    if tags is not None and any(tags):
        for tag in set(tags):
            if tag is not None:
                check_tag(tag)
        cols.tags = list(tags)
    return cols


def _add_headers(cols: Columns, headers: Sequence[Headers | None]) -> None:
    encoded: list[bytes] = []
    sizes = cols.sizes
    for i, h in enumerate(headers):
        if not h:
            encoded.append(b"")
            continue
        headers_size(h)  # the checks send() makes (types, lengths, count)
        raw = encode_headers(h)
        encoded.append(raw)
        sizes[i] += len(raw)
    cols.headers = encoded
    cols.header_dicts = list(headers)


def _as_bytes_list(items: Sequence[Any], what: str, allow_none: bool) -> list[Any]:
    """``items`` as a list of bytes (None kept where allowed): one C pass over the types when they are
    all bytes already, a copy of each bytearray/memoryview otherwise."""
    kinds = set(map(type, items))
    if kinds <= ({bytes, _NONE} if allow_none else {bytes}):
        return items if isinstance(items, list) else list(items)
    out = []
    for i, item in enumerate(items):
        if item.__class__ is bytes or (item is None and allow_none):
            out.append(item)
        elif isinstance(item, bytearray | memoryview):
            out.append(bytes(item))
        else:
            raise InvalidArgument(f"{what} {i} must be bytes, got {type(item).__name__}")
    return out


def split(
    cols: Columns, partitions: int, keyless: Callable[[], int], sticky: bool
) -> tuple[list[int] | None, list[tuple[int, int, int]]]:
    """Which partition each record goes to: the records' positions in the call sorted by partition
    (stable: each partition's records in the call's order; None when all go to one partition), and
    the groups (partition, start, end) in that order, partitions ascending.

    A keyed record goes to ``crc32(key) % partitions``, as with send(); a keyless one to ``keyless()``
    (``sticky``: the sticky partition, the same for the whole call; the round-robin partitioner turns
    per record). Sorting the positions by partition (``sorted`` with a C-level key) groups them with no
    Python step per record.
    """
    keys = cols.keys
    n = len(cols.values)
    if n == 0:
        return None, []
    if partitions == 1:
        return None, [(0, 0, n)]
    if keys is None:
        if sticky:
            return None, [(keyless(), 0, n)]
        parts = [keyless() for _ in range(n)]
    elif cols.key_lengths is not None and NO_KEY in cols.key_lengths:
        parts = [keyless() if k is None else zlib.crc32(k) % partitions for k in keys]
    else:
        # operator.mod over repeat(): about 20 ns a record against 30 for the bound partitions.__rmod__.
        parts = list(map(mod, map(zlib.crc32, keys), repeat(partitions)))  # type: ignore[arg-type]
    counts = Counter(parts)
    if len(counts) == 1:
        return None, [(parts[0], 0, n)]
    order = sorted(range(n), key=parts.__getitem__)
    groups = []
    start = 0
    for p in sorted(counts):
        groups.append((p, start, start + counts[p]))
        start += counts[p]
    return order, groups


def headers_size(headers: Headers) -> int:
    """The encoded size of a record's headers, checking them (InvalidArgument)."""
    if not isinstance(headers, dict):
        raise InvalidArgument(f"headers must be a dict of str to bytes, got {type(headers).__name__}")
    size = 2
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, bytes):
            raise InvalidArgument(f"header {name!r}: names must be str and values bytes")
        raw = len(name.encode())
        if raw > 0xFFFF or len(value) > 0xFFFFFFFF:
            raise InvalidArgument(f"header {name!r} is too long")
        size += 6 + raw
        size += len(value)
    if len(headers) > 0xFFFF:
        raise InvalidArgument("a record has at most 65535 headers")
    return size


def as_bytes(value: object, what: str) -> bytes:
    """A value or key as bytes (a bytearray or memoryview copied), else InvalidArgument."""
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise InvalidArgument(f"{what} must be bytes, got {type(value).__name__}")
