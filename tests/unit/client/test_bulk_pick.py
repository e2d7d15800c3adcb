"""``send_many``'s columns: ``prepare``'s size per record, and ``Columns.pick`` (how a call's records
are grouped by partition): every column (the optional ones too) reordered by the index it is given, as
lists, for an index of one record or of many."""

from __future__ import annotations

from sluice.client.producer.bulk import Columns, prepare, split
from sluice.codec.batch import BatchBuilder


def _columns(n: int) -> Columns:
    cols = prepare(
        [b"v%d" % i for i in range(n)],
        [None if i == 2 else b"k%d" % i for i in range(n)],
        [{"h": b"%d" % i} if i % 2 else None for i in range(n)],
        ["t" if i % 3 else None for i in range(n)],
        None,
        lambda tag: None,
    )
    assert cols.headers is not None
    assert cols.tags is not None
    assert cols.key_lengths is not None
    return cols


def _rows(cols: Columns) -> list[tuple[object, ...]]:
    assert cols.keys is not None
    assert cols.key_lengths is not None
    assert cols.headers is not None
    assert cols.header_dicts is not None
    assert cols.tags is not None
    return list(
        zip(
            cols.values, cols.keys, cols.value_lengths, cols.key_lengths, cols.sizes,
            cols.headers, cols.header_dicts, cols.tags, strict=True,
        )
    )  # fmt: skip


def test_pick_reorders_every_column_as_lists() -> None:
    cols = _columns(7)
    rows = _rows(cols)
    for index in ([3], [6, 0, 2], [4, 1, 5, 0, 6, 2, 3]):
        picked = cols.pick(index)
        assert _rows(picked) == [rows[i] for i in index]
        for col in (picked.values, picked.keys, picked.sizes, picked.headers, picked.tags):
            assert type(col) is list  # extend() and the batch's columns take lists


def test_split_then_pick_keeps_each_partition_in_call_order() -> None:
    n = 50
    cols = prepare([b"v%d" % i for i in range(n)], [b"k%d" % i for i in range(n)], None, None, None, print)
    order, groups = split(cols, 4, lambda: 0, True)
    assert order is not None
    assert len(groups) > 1
    picked = cols.pick(order)
    for _p, start, end in groups:
        positions = [int(v[1:]) for v in picked.values[start:end]]
        assert positions == sorted(positions)  # each partition's records in the call's order
    assert sorted(picked.values) == sorted(cols.values)


def test_prepare_sizes_are_what_append_counts() -> None:
    """``prepare``'s size per record (which fills batches and bounds a record by max_request_size) is
    what ``BatchBuilder.append`` adds for it, for every shape of keys: all bytes, some absent, all absent
    (as keyless), none given; with headers and without."""
    values = [b"v" * i for i in range(6)]
    shapes: list[list[bytes | None] | None] = [
        [b"k" * (i + 1) for i in range(6)],
        [None if i % 2 else b"k" * i for i in range(6)],
        [None] * 6,
        None,
    ]
    for keys in shapes:
        for headers in (None, [{"h": b"x" * i} if i % 3 else None for i in range(6)]):
            cols = prepare(values, keys, headers, None, None, print)
            for i, value in enumerate(values):
                builder = BatchBuilder()
                before = builder.size
                key = None if keys is None else keys[i]
                builder.append(value, key, None, None if headers is None else headers[i], 0)
                assert cols.sizes[i] == builder.size - before, (keys, headers, i)
