"""The batch's header summary: which header names (exactly) and values (a bloom filter) it holds.

Why: an SQL92 property filter (``codec/sql_filter.py``) needs a record's headers, and decoding them
is the broker's main cost on a filtered fetch. A batch whose summary proves that no record can match
(``a = 'x'`` when no record has the value ``x`` for ``a``, or any comparison on a header no record
has) is skipped from its tag table alone, as a tag filter skips one (RocketMQ's consume-queue bitmap
is the prior art, docs/filters.md "Batch pruning").

Where it lives: as one reserved entry of the batch's tag table, so the batch format is unchanged:
older brokers and consumers see an extra tag that no record points to and no tag filter can name
(it starts with a NUL, which the tag alphabet excludes), and a batch without the entry (written by an
older producer, or rebuilt by a filter) simply cannot be pruned. The entry is text, since the tag
table holds UTF-8: ``"\\x00hs1:"`` then the base64 of::

    u16 name count, then per name u16 length + UTF-8 (every header name in the batch, sorted)
    per name, in the same order, one byte: 1 if its values are in the bloom, 0 if it had too many
    u8 k (hash count; 0: no bloom), u16 bloom length in bytes, the bloom (a power of two bits)

The bloom holds, for every (name, value) pair of a summarised name, the key ``name NUL value`` and,
when the value is a number (``numeric``), also ``name 0x01 canonical(number)``, so that ``a = 5``
matches the values ``5``, ``05`` and ``5.0`` as the filter's typing says it must. Bit ``i`` of a
key: ``(crc32(key) + i * crc32c(key)) mod bits`` (double hashing over two unrelated CRCs, both C).

Pure: no I/O, no clock. Callers: ``build`` (writes it), ``codec/sql_filter`` (reads it).
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from sluice.codec.batch.layout import crc32c_ext as _crc32c

#: The reserved tag-table entry's prefix (NUL: outside the tag alphabet, so no tag filter names it).
SUMMARY_PREFIX = "\x00hs1:"
#: A name with more distinct values than this in one batch (an id, a timestamp) is listed, but its
#: values are left out of the bloom: they would fill it and prune nothing.
MAX_VALUES_PER_NAME = 64
#: Bloom sizing: about 10 bits per key (1 % false positives with 3 hashes), at most 1 KiB per batch.
BITS_PER_KEY = 10
MAX_BLOOM_BYTES = 1024
HASHES = 3
#: The summary is left out when the names alone would make it larger than this (a batch of
#: thousands of distinct header names is not one a filter can prune).
MAX_SUMMARY_BYTES = 8192

_U16 = struct.Struct("<H")
_NUMBER = re.compile(rb"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(rb"[+-]?\d+")


@lru_cache(maxsize=65536)
def numeric(value: bytes) -> int | float | None:
    """The number a header value spells (``12``, ``-3.5``, ``1e3``), or None when it is not one.

    Strict on purpose: no spaces, no ``_``, no ``nan``/``inf`` words (Python's ``int``/``float``
    accept them all). Cached: header values repeat (a region, a priority), and parsing is the cost.
    """
    if len(value) > 64 or not _NUMBER.fullmatch(value):
        return None
    return int(value) if _INTEGER.fullmatch(value) else float(value)


def canonical(number: int | float) -> bytes:
    """One spelling per number, so equal numbers share a bloom key (``5``, ``5.0`` -> ``5``)."""
    if isinstance(number, float) and number.is_integer():
        return str(int(number)).encode()
    return str(number).encode() if isinstance(number, int) else repr(number).encode()


def string_key(name: str, value: bytes) -> bytes:
    return name.encode() + b"\x00" + value


def number_key(name: str, number: int | float) -> bytes:
    return name.encode() + b"\x01" + canonical(number)


def _bits(key: bytes, m: int) -> list[int]:
    h1 = zlib.crc32(key)
    h2 = int(_crc32c.crc32c(key)) | 1
    return [(h1 + i * h2) & (m - 1) for i in range(HASHES)]


def build_summary(pairs: Iterable[tuple[str, bytes]]) -> str | None:
    """The summary tag entry for a batch holding these (name, value) header pairs; None if empty."""
    values: dict[str, set[bytes]] = {}
    for name, value in pairs:
        values.setdefault(name, set()).add(value)
    if not values:
        return None
    names = sorted(values)
    keys: list[bytes] = []
    flags = bytearray()
    for name in names:
        vs = values[name]
        if len(vs) > MAX_VALUES_PER_NAME:
            flags.append(0)
            continue
        flags.append(1)
        for v in vs:
            keys.append(string_key(name, v))
            num = numeric(v)
            if num is not None:
                keys.append(number_key(name, num))
    parts = [_U16.pack(len(names))]
    for name in names:
        raw = name.encode()
        parts += (_U16.pack(len(raw)), raw)
    parts.append(bytes(flags))
    if keys:
        nbytes = 8
        while nbytes * 8 < BITS_PER_KEY * len(keys) and nbytes < MAX_BLOOM_BYTES:
            nbytes *= 2
        bloom = bytearray(nbytes)
        for key in keys:
            for b in _bits(key, nbytes * 8):
                bloom[b >> 3] |= 1 << (b & 7)
        parts += (bytes((HASHES,)), _U16.pack(nbytes), bytes(bloom))
    else:
        parts += (b"\x00", _U16.pack(0))
    payload = b"".join(parts)
    if len(payload) > MAX_SUMMARY_BYTES:
        return None
    return SUMMARY_PREFIX + base64.b64encode(payload).decode()


@dataclass(frozen=True, slots=True)
class HeaderSummary:
    """A decoded summary. ``names``: exactly the header names of the batch's records."""

    names: frozenset[str]
    #: Names whose values are all in the bloom (a key absent from the bloom is absent from the batch).
    valued: frozenset[str]
    bloom: bytes
    hashes: int

    def may_hold(self, name: str, key: bytes) -> bool:
        """False only when no record of the batch can have this (name, value) key."""
        if name not in self.names:
            return False
        if name not in self.valued or not self.hashes:
            return True
        bloom = self.bloom
        return all(bloom[b >> 3] >> (b & 7) & 1 for b in _bits(key, len(bloom) * 8))


def find_summary(tags: Sequence[str]) -> HeaderSummary | None:
    """The summary among a batch's tag table entries; None when there is none (cannot prune) or it
    is malformed (also cannot prune: a damaged summary must never hide records)."""
    for t in reversed(tags):  # the builder writes it last
        if t.startswith(SUMMARY_PREFIX):
            return _decode(t)
    return None


@lru_cache(maxsize=4096)
def _decode(entry: str) -> HeaderSummary | None:
    try:
        raw = base64.b64decode(entry[len(SUMMARY_PREFIX) :], validate=True)
        (count,) = _U16.unpack_from(raw, 0)
        p = 2
        names: list[str] = []
        for _ in range(count):
            (n,) = _U16.unpack_from(raw, p)
            names.append(raw[p + 2 : p + 2 + n].decode())
            p += 2 + n
        flags = raw[p : p + count]
        p += count
        hashes = raw[p]
        (nbytes,) = _U16.unpack_from(raw, p + 1)
        bloom = raw[p + 3 : p + 3 + nbytes]
        if len(flags) != count or len(bloom) != nbytes or p + 3 + nbytes != len(raw):
            return None
        if nbytes & (nbytes - 1) or (hashes and not nbytes):
            return None
    except (binascii.Error, struct.error, IndexError, UnicodeDecodeError, ValueError):
        return None
    valued = frozenset(n for n, f in zip(names, flags, strict=True) if f)
    return HeaderSummary(frozenset(names), valued, bytes(bloom), hashes)


def is_summary(tag: str) -> bool:
    return tag.startswith(SUMMARY_PREFIX)
