"""A Hypothesis strategy for any protobuf message, built field by field from its descriptor.

Well-typed but arbitrary: every field may be unset or set, with a bias toward the values that break
validation (empty and very long strings, unicode, the extremes of each integer type, negative numbers,
unknown enum values, repeated entries with duplicates). Nesting is bounded, so recursive messages end.
A few names the fuzz cluster really has (``KNOWN_NAMES``) are mixed into strings, so requests also get
past "unknown topic" and reach deeper checks.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

#: Names that exist in the fuzz cluster (conftest.py makes them).
KNOWN_NAMES = ("fuzz", "fuzz-sub", "fuzz-group", "*")
#: Deeper than this, sub-messages stay unset.
MAX_DEPTH = 3
MAX_REPEATED = 4

_T = FieldDescriptor

_INT_RANGES = {
    _T.CPPTYPE_INT32: (-(2**31), 2**31 - 1),
    _T.CPPTYPE_INT64: (-(2**63), 2**63 - 1),
    _T.CPPTYPE_UINT32: (0, 2**32 - 1),
    _T.CPPTYPE_UINT64: (0, 2**64 - 1),
}


def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    edges = sorted({v for v in (0, 1, 2, -1, 7, 1000, low, high, low + 1, high - 1) if low <= v <= high})
    return st.one_of(
        st.sampled_from(edges),
        st.integers(-5, 5000).filter(lambda v: low <= v <= high),
        st.integers(low, high),
    )


_long_text = st.builds(
    lambda c, n: c * n,
    st.sampled_from(["x", "é", "💥", "\x00", "/", "."]),
    st.sampled_from([255, 256, 1000, 70_000]),
)
TEXT: st.SearchStrategy[str] = st.one_of(
    st.sampled_from(["", " ", *KNOWN_NAMES, "-", "..", "a/b", "a b", "\n", "ü", "名前"]),
    st.text(max_size=20),
    _long_text,
)
BYTES: st.SearchStrategy[bytes] = st.one_of(
    st.just(b""), st.binary(max_size=64), st.builds(lambda n: b"\xff" * n, st.sampled_from([1000, 70_000]))
)


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    cpp = field.cpp_type
    if cpp in _INT_RANGES:
        return _integers(*_INT_RANGES[cpp])
    if cpp == _T.CPPTYPE_BOOL:
        return st.booleans()
    if cpp in (_T.CPPTYPE_DOUBLE, _T.CPPTYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=64 if cpp == _T.CPPTYPE_DOUBLE else 32)
    if cpp == _T.CPPTYPE_ENUM:
        assert field.enum_type is not None
        numbers = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(numbers), _integers(-(2**31), 2**31 - 1))
    if field.type == _T.TYPE_BYTES:
        return BYTES
    return TEXT


def _with_duplicates(items: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """Lists, sometimes with their first entry repeated (duplicate topics, ids, partitions)."""
    return st.tuples(st.lists(items, max_size=MAX_REPEATED), st.booleans()).map(
        lambda t: t[0] + t[0][:1] if t[1] else t[0]
    )


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _field_values(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any] | None:
    """What to assign to ``field`` (a list for repeated fields, a dict for maps), or None to leave
    it unset at this depth."""
    if _is_map(field):
        assert field.message_type is not None
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        values = _single(value, depth + 1)
        if values is None:
            return None
        return st.dictionaries(_scalar(key), values, max_size=MAX_REPEATED)
    single = _single(field, depth)
    if single is None:
        return None
    if field.is_repeated:
        return _with_duplicates(single)
    return single


def _single(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any] | None:
    if field.message_type is None:
        return _scalar(field)
    if depth >= MAX_DEPTH:
        return None
    return message_strategy(field.message_type, depth + 1)


@st.composite
def _build(draw: st.DrawFn, descriptor: Descriptor, depth: int) -> Message:
    msg = GetMessageClass(descriptor)()
    for field in descriptor.fields:
        values = _field_values(field, depth)
        if values is None or not draw(st.booleans()):
            continue
        value = draw(values)
        target: Any = getattr(msg, field.name)
        if _is_map(field):
            for k, v in value.items():
                if isinstance(v, Message):
                    target[k].CopyFrom(v)
                else:
                    target[k] = v
        elif field.is_repeated:
            target.extend(value)
        elif isinstance(value, Message):
            target.CopyFrom(value)
        else:
            setattr(msg, field.name, value)
    return msg


_CACHE: dict[tuple[str, int], st.SearchStrategy[Message]] = {}


def message_strategy(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Arbitrary messages of ``descriptor``'s type (cached: descriptors are walked once)."""
    key = (descriptor.full_name, depth)
    if key not in _CACHE:
        _CACHE[key] = _build(descriptor, depth)
    return _CACHE[key]


@st.composite
def raw_request(draw: st.DrawFn, descriptor: Descriptor) -> bytes:
    """Bytes sent as a serialized request: random, or a real message's encoding cut or flipped."""
    kind = draw(st.sampled_from(["random", "truncated", "flipped", "trailer"]))
    if kind == "random":
        return draw(st.binary(min_size=1, max_size=200))
    good = draw(message_strategy(descriptor)).SerializeToString()
    if not good:
        return draw(st.binary(min_size=1, max_size=50))
    if kind == "truncated":
        return good[: draw(st.integers(0, len(good) - 1))]
    if kind == "trailer":
        return good + draw(st.binary(min_size=1, max_size=40))
    buf = bytearray(good)
    for _ in range(draw(st.integers(1, 4))):
        buf[draw(st.integers(0, len(buf) - 1))] ^= draw(st.integers(1, 255))
    return bytes(buf)
