"""The compiled SQL92 filter against a plain reference evaluator (a tree walk with explicit
three-valued logic, written here), on random expressions and random headers; and batch pruning
against the records it prunes: a pruned batch never holds a matching record."""

from __future__ import annotations

import re
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec.batch import decode_records, encode_headers, encode_records, read_header, read_tags
from sluice.codec.batch.summary import build_summary, find_summary
from sluice.codec.sql_filter import compile_sql, raw_headers
from tests.examples import examples

NAMES = ["a", "b", "c"]
STRINGS = ["x", "y", "it's", "", "5", "05", "-1.5", "a-long-value"]
NUMBERS = [0, 1, 5, -2, 2.5, 100, 1e3, 100000000]
# Short values (<= 7 bytes: deduplicated in numpy by the broker) and long ones (sliced per record).
VALUES = [b"x", b"y", b"it's", b"", b"5", b"05", b"5.0", b"-1.5", b"2.5", b"1000", b"abc", b"1e3", b" 5"]
VALUES += [b"x\x00", b"a-long-value", b"100000000", b"0000000005", b"x\x00\x00\x00\x00\x00\x00\x00"]


# ---- the reference: an AST, its SQL text, and a tree walk over None/True/False -------------------


@dataclass(frozen=True)
class Node:
    kind: str
    args: tuple[object, ...]


def sql_literal(v: object) -> str:
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


def render(n: Node) -> str:
    k, a = n.kind, n.args
    if k in ("and", "or"):
        return "(" + f" {k.upper()} ".join(render(c) for c in a) + ")"  # type: ignore[arg-type]
    if k == "not":
        return f"NOT ({render(a[0])})"  # type: ignore[arg-type]
    if k == "const":
        return "TRUE" if a[0] else "FALSE"
    if k == "cmp":
        return f"{a[0]} {a[1]} {sql_literal(a[2])}"
    if k == "null":
        return f"{a[0]} IS {'NOT ' if a[1] else ''}NULL"
    if k == "between":
        return f"{a[0]} {'NOT ' if a[3] else ''}BETWEEN {sql_literal(a[1])} AND {sql_literal(a[2])}"
    items = ", ".join(sql_literal(v) for v in a[1])  # type: ignore[attr-defined]
    return f"{a[0]} {'NOT ' if a[2] else ''}IN ({items})"


_NUM = re.compile(rb"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def as_number(v: bytes) -> float | None:
    return float(v) if _NUM.fullmatch(v) else None


def ref(n: Node, h: dict[str, bytes]) -> bool | None:  # noqa: PLR0911 - one flat walk reads best
    k, a = n.kind, n.args
    if k == "and":
        vals = [ref(c, h) for c in a]  # type: ignore[arg-type]
        return False if False in vals else (None if None in vals else True)
    if k == "or":
        vals = [ref(c, h) for c in a]  # type: ignore[arg-type]
        return True if True in vals else (None if None in vals else False)
    if k == "not":
        r = ref(a[0], h)  # type: ignore[arg-type]
        return None if r is None else not r
    if k == "const":
        return bool(a[0])
    v = h.get(str(a[0]))
    if k == "null":
        return (v is not None) == a[1]
    if v is None:
        return None
    if k == "cmp":
        op, lit = a[1], a[2]
        assert isinstance(lit, (str, int, float))
        if isinstance(lit, str):
            eq = v == lit.encode()
            return eq if op == "=" else not eq
        x = as_number(v)
        if x is None:
            return None
        return {"=": x == lit, "<>": x != lit, "<": x < lit, "<=": x <= lit, ">": x > lit, ">=": x >= lit}[
            str(op)
        ]
    if k == "between":
        x = as_number(v)
        if x is None:
            return None
        inside = a[1] <= x <= a[2]  # type: ignore[operator]
        return not inside if a[3] else inside
    items = a[1]
    if isinstance(items[0], str):  # type: ignore[index]
        found = v in {s.encode() for s in items}  # type: ignore[attr-defined]
    else:
        x = as_number(v)
        if x is None:
            return None
        found = x in items  # type: ignore[operator]
    return not found if a[2] else found


names = st.sampled_from(NAMES)
num = st.sampled_from(NUMBERS)
string = st.sampled_from(STRINGS)
atoms = st.one_of(
    st.builds(lambda b: Node("const", (b,)), st.booleans()),
    st.builds(lambda n, op, v: Node("cmp", (n, op, v)), names, st.sampled_from(["=", "<>"]), string | num),
    st.builds(lambda n, op, v: Node("cmp", (n, op, v)), names, st.sampled_from(["<", "<=", ">", ">="]), num),
    st.builds(lambda n, neg: Node("null", (n, neg)), names, st.booleans()),
    st.builds(lambda n, lo, hi, neg: Node("between", (n, lo, hi, neg)), names, num, num, st.booleans()),
    st.builds(
        lambda n, vs, neg: Node("in", (n, tuple(vs), neg)),
        names,
        st.lists(string, min_size=1, max_size=3) | st.lists(num, min_size=1, max_size=3),
        st.booleans(),
    ),
)
exprs = st.recursive(
    atoms,
    lambda kids: st.one_of(
        st.builds(lambda cs: Node("and", tuple(cs)), st.lists(kids, min_size=2, max_size=3)),
        st.builds(lambda cs: Node("or", tuple(cs)), st.lists(kids, min_size=2, max_size=3)),
        st.builds(lambda c: Node("not", (c,)), kids),
    ),
    max_leaves=8,
)
headers = st.dictionaries(names, st.sampled_from(VALUES), max_size=3)


@settings(max_examples=examples(200), deadline=None)
@given(exprs, st.lists(headers, min_size=1, max_size=8))
def test_compiled_filter_agrees_with_the_reference(expr: Node, records: list[dict[str, bytes]]) -> None:
    f = compile_sql(render(expr))
    for h in records:
        want = ref(expr, h) is True
        assert f.matches(h) == want, (render(expr), h)
        # The broker's path: the encoded blob read by ``raw_headers``, filtered by ``matches_raw``.
        blob = encode_headers(h)
        assert f.matches_raw(raw_headers(blob, 0, len(blob))) == want, (render(expr), h)
    assert f.matches_empty == (ref(expr, {}) is True)


@settings(max_examples=examples(150), deadline=None)
@given(exprs, st.lists(headers, min_size=1, max_size=12))
def test_pruning_never_hides_a_match(expr: Node, records: list[dict[str, bytes]]) -> None:
    """The summary the producer writes, read back from the batch, never prunes a batch that has a
    matching record (pruning is only allowed to be conservative)."""
    f = compile_sql(render(expr))
    batch = encode_records((b"v", None, None, h, 1) for h in records)
    summary = find_summary(read_tags(batch, 0, read_header(batch)))
    if any(records):
        assert summary is not None
    if summary is not None and any(f.matches(h) for h in records):
        assert f.may_match(summary), (render(expr), records)


def test_pruning_skips_what_cannot_match() -> None:
    """The point of the summary: a value or a header no record has prunes the batch."""
    records = [{"region": b"eu", "prio": str(i % 3).encode(), "id": str(i).encode()} for i in range(200)]
    entry = build_summary(p for h in records for p in h.items())
    assert entry is not None
    summary = find_summary(("tagA", entry))
    assert summary is not None
    assert not compile_sql("region = 'us'").may_match(summary)
    assert not compile_sql("region IN ('us', 'ap')").may_match(summary)
    assert not compile_sql("prio = 7").may_match(summary)
    assert not compile_sql("missing > 3 OR missing IS NOT NULL").may_match(summary)
    assert not compile_sql("NOT (missing = 1)").may_match(summary)
    assert compile_sql("prio = 2.0").may_match(summary)  # a number: 2 and 2.0 are one key
    assert compile_sql("region = 'eu' AND prio > 1").may_match(summary)
    assert compile_sql("missing IS NULL").may_match(summary)
    # ``id`` has 200 distinct values: listed, but its values are not in the bloom (cannot prune).
    assert compile_sql("id = 'nope'").may_match(summary)
    assert not summary.may_hold("nope", b"x")


def test_a_damaged_summary_cannot_prune() -> None:
    from sluice.codec.batch.summary import SUMMARY_PREFIX

    assert find_summary((SUMMARY_PREFIX + "!!not base64",)) is None
    assert find_summary((SUMMARY_PREFIX + "AAAA",)) is None


@settings(max_examples=examples(120), deadline=None)
@given(
    st.lists(st.sampled_from(NAMES), min_size=0, max_size=3, unique=True),
    st.lists(st.lists(st.sampled_from(VALUES), min_size=3, max_size=3), min_size=1, max_size=40),
    st.booleans(),
)
def test_column_reads_agree_with_per_record_reads(
    shape: list[str], values: list[list[bytes]], break_uniformity: bool
) -> None:
    """``header_columns`` (the broker's column-wise read of uniform batches) gives exactly what a
    record-by-record read gives, or None (then the broker reads record by record)."""
    from sluice.codec.header_columns import header_columns

    records = [dict(zip(shape, vs, strict=False)) for vs in values]
    if break_uniformity and records:
        records[len(records) // 2] = {"z": b"1", **records[len(records) // 2]}
    blobs = [encode_headers(h) if h else b"" for h in records]
    prefix = b"junk"
    starts = [len(prefix)]
    for b in blobs:
        starts.append(starts[-1] + len(b))
    buf = prefix + b"".join(blobs) + b"tail"
    wanted = ["a", "c", "z"]
    cols = header_columns(buf, starts, wanted)
    if cols is None:
        return
    assert all(records)  # a batch with a header-less record is never read column-wise
    for name, col in zip(wanted, cols, strict=True):
        assert col.per_record() == [h.get(name) for h in records]


@settings(max_examples=examples(120), deadline=None)
@given(
    exprs,
    st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True),
    st.lists(st.lists(st.sampled_from(VALUES), min_size=3, max_size=3), min_size=1, max_size=48),
)
def test_broker_batch_filter_agrees_with_the_reference(
    expr: Node, shape: list[str], values: list[list[bytes]]
) -> None:
    """The whole broker path over one batch (summary pruning, the column-wise or record-wise read,
    the positional or dict filter, the cut) keeps exactly the records the reference keeps."""
    from sluice.broker.filtering import filter_chunk

    records = [dict(zip(shape, vs, strict=False)) for vs in values]
    batch = encode_records((str(i).encode(), None, None, h, 1) for i, h in enumerate(records))
    out = filter_chunk(batch, 0, frozenset(), 1 << 20, True, compile_sql(render(expr)))
    assert out.next_offset == len(records)
    kept = [r.offset for b in out.batches for r in decode_records(b, "t", 0)]
    assert kept == [i for i, h in enumerate(records) if ref(expr, h) is True], render(expr)


def test_uniform_batches_are_read_column_wise() -> None:
    from sluice.codec.header_columns import header_columns

    blobs = [encode_headers({"a": str(i).encode(), "b": b"x"}) for i in range(100)]
    starts = [0]
    for b in blobs:
        starts.append(starts[-1] + len(b))
    cols = header_columns(b"".join(blobs), starts, ["b", "a", "q"])
    assert cols is not None
    assert cols is not None
    want = [[b"x"] * 100, [str(i).encode() for i in range(100)], [None] * 100]
    assert [c.per_record() for c in cols] == want
    assert cols[0].values == [b"x"]  # short values: deduplicated, one slice for the whole batch
