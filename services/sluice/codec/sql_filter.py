"""SQL92 property filters (RocketMQ's grammar and typing), compiled once to Python code.

Grammar (keywords in any case; docs/filters.md)::

    expr      := term (OR term)*
    term      := factor (AND factor)*
    factor    := NOT factor | '(' expr ')' | TRUE | FALSE | predicate
    predicate := name ('=' | '<>' | '<' | '<=' | '>' | '>=') literal
               | name IS [NOT] NULL
               | name [NOT] BETWEEN number AND number
               | name [NOT] IN '(' literal (',' literal)* ')'
    literal   := 'string' ('' escapes a quote) | number (12, -3.5, 1e3)

Typing: ``= <>`` and ``IN`` compare strings (bytes, exactly) or numbers; ``< <= > >=`` and
``BETWEEN`` take numbers only (``a > 'x'`` is refused when compiled, with its position). A header
value is bytes; against a number literal it is read as a number (``numeric``): ``05`` = 5, and a
value that is not a number makes the comparison NULL. A missing header is NULL: it matches no
comparison, and ``NOT`` of NULL is NULL (SQL's three-valued logic), so a record matches when the
expression is TRUE.

Compiling: the parse tree is turned into the source of ONE Python function (``def _f(h)``) whose
body is a single boolean expression over the header dict, compiled with ``compile``: per record
there is no tree walk and no call per node. Three-valued logic needs no ``None`` juggling at run
time: each node is generated in two polarities, "is TRUE" and "is FALSE", and ``NOT`` swaps them
(a node that is NULL is neither). Literals and names enter the code as bound constants, never as
text, so no expression can inject code.

The same tree also yields ``may_match(summary)``: whether a batch whose header summary
(``codec/batch/summary.py``) this is can hold a matching record at all (batch pruning).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from sluice.codec.batch.layout import Headers
from sluice.codec.batch.summary import HeaderSummary, number_key, numeric, string_key
from sluice.codec.filter_limits import filter_limits
from sluice.errors import InvalidFilter

# The limits on an expression (length, depth, IN list) are ``codec/filter_limits``'s, configurable per
# service; the length is the whole filter's, ``%SQL92%`` prefix included (``codec/filter.py``).

_GRAMMAR = r"""
?start: expr
?expr: term
     | term (_OR term)+  -> or_
?term: factor
     | factor (_AND factor)+  -> and_
?factor: _NOT factor  -> not_
       | "(" expr ")"
       | _TRUE  -> true
       | _FALSE  -> false
       | NAME CMP literal  -> cmp
       | NAME _IS _NULL  -> is_null
       | NAME _IS _NOT _NULL  -> is_not_null
       | NAME _BETWEEN literal _AND literal  -> between
       | NAME _NOT _BETWEEN literal _AND literal  -> not_between
       | NAME _IN "(" literal ("," literal)* ")"  -> in_
       | NAME _NOT _IN "(" literal ("," literal)* ")"  -> not_in
literal: STRING | NUMBER
CMP: "<>" | "<=" | ">=" | "=" | "<" | ">"
_OR.2: /or\b/i
_AND.2: /and\b/i
_NOT.2: /not\b/i
_IS.2: /is\b/i
_NULL.2: /null\b/i
_IN.2: /in\b/i
_BETWEEN.2: /between\b/i
_TRUE.2: /true\b/i
_FALSE.2: /false\b/i
NAME: /[A-Za-z_$][A-Za-z0-9_.$-]*/
STRING: /'(?:[^']|'')*'/
NUMBER: /[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?/
%ignore /\s+/
"""


@lru_cache(maxsize=1)
def _parser() -> Lark:
    """Built on the first SQL filter parsed, not at import: every service imports this module, few
    parse a filter, and the built tables cost ~1.6 MB of RSS (docs/latency.md, "Memory")."""
    return Lark(_GRAMMAR, parser="lalr", propagate_positions=True, maybe_placeholders=False)


Literal = bytes | int | float
MayMatch = Callable[[HeaderSummary], bool]


@dataclass(frozen=True, eq=False, slots=True)
class SqlFilter:
    """A compiled SQL92 filter. ``matches(headers)``: the record matches (the expression is TRUE)."""

    expression: str
    matches: Callable[[Headers], bool]
    #: False when a batch with this header summary cannot hold a matching record.
    may_match: MayMatch
    #: The header names the expression reads.
    names: frozenset[str]
    #: The answer for a record without headers (computed once: such records are common).
    matches_empty: bool
    #: ``matches`` over headers keyed by name bytes (``raw_headers``: the broker's fast path).
    matches_raw: Callable[[dict[bytes, bytes]], bool]
    #: The header names ``matches_values`` takes, in its argument order.
    columns: tuple[str, ...]
    #: ``matches`` of the values of ``columns`` (None: missing), for column-wise evaluation.
    matches_values: Callable[..., bool]


def _where(expression: str, line: int, column: int) -> str:
    return f"at line {line}, column {column}" if "\n" in expression else f"at column {column}"


def _fail(expression: str, what: str, token: Token | None = None) -> InvalidFilter:
    if token is None or token.line is None or token.column is None:
        return InvalidFilter(f"invalid SQL92 filter {expression!r}: {what}")
    where = _where(expression, token.line, token.column)
    return InvalidFilter(
        f"invalid SQL92 filter {expression!r} {where}: {what}", line=token.line, column=token.column
    )


def _parse(expression: str) -> Tree[Token]:
    max_length = filter_limits().max_length
    if len(expression) > max_length:
        raise InvalidFilter(
            f"SQL92 filter of {len(expression)} characters exceeds the limit of {max_length} "
            "(max_filter_length)",
            limit=max_length,
        )
    if not expression.strip():
        raise InvalidFilter("empty SQL92 filter (use TRUE to match everything)")
    try:
        tree = _parser().parse(expression)
    except UnexpectedInput as exc:
        line, column = exc.line, exc.column
        if isinstance(exc, UnexpectedEOF) or line < 0:
            what = "the expression ends too early"
        elif isinstance(exc, UnexpectedCharacters):
            what = f"unexpected character {expression[exc.pos_in_stream or 0]!r}"
        elif isinstance(exc, UnexpectedToken):
            at_end = exc.token.type == "$END"
            what = "the expression ends too early" if at_end else f"unexpected {exc.token!s}"
        else:  # pragma: no cover - lark's three kinds are handled above
            what = "syntax error"
        if line < 0:
            raise InvalidFilter(f"invalid SQL92 filter {expression!r}: {what}") from None
        where = _where(expression, line, column)
        raise InvalidFilter(
            f"invalid SQL92 filter {expression!r} {where}: {what}", line=line, column=column
        ) from None
    _check_depth(expression, tree)
    return tree


def _check_depth(expression: str, tree: Tree[Token]) -> None:
    """Nesting beyond ``max_depth`` is refused (iteratively: the check must not recurse)."""
    max_depth = filter_limits().max_depth
    stack: list[tuple[Tree[Token], int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise InvalidFilter(
                f"SQL92 filter {expression[:80]!r} nests deeper than the limit of {max_depth} "
                "(max_filter_depth)",
                limit=max_depth,
            )
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, Tree))


def _literal(expression: str, node: Tree[Token]) -> tuple[Literal, Token]:
    tok = node.children[0]
    assert isinstance(tok, Token)
    if tok.type == "STRING":
        return tok[1:-1].replace("''", "'").encode(), tok
    value = numeric(tok.encode())
    if value is None:  # pragma: no cover - the NUMBER terminal is the same language
        raise _fail(expression, f"{tok!s} is not a number", tok)
    return value, tok


class _Compiler:
    """One expression's code generation: source text plus the constants it binds."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.consts: dict[str, object] = {}
        self.names: dict[str, int] = {}
        self.numeric_names: set[int] = set()

    def const(self, value: object) -> str:
        key = f"c{len(self.consts)}"
        self.consts[key] = value
        return key

    def name(self, tok: object, numeric_use: bool) -> tuple[str, str]:
        assert isinstance(tok, Token)
        i = self.names.setdefault(str(tok), len(self.names))
        if numeric_use:
            self.numeric_names.add(i)
        return f"v{i}", f"x{i}"

    def literals(self, nodes: list[Tree[Token]]) -> tuple[list[Literal], bool]:
        """The literals of an IN list or BETWEEN, all of one type (else InvalidFilter)."""
        values = [_literal(self.expression, n) for n in nodes]
        kinds = {isinstance(v, bytes) for v, _ in values}
        if len(kinds) > 1:
            tok = next(t for v, t in values if isinstance(v, bytes) != isinstance(values[0][0], bytes))
            raise _fail(self.expression, "a list mixes strings and numbers", tok)
        max_in_list = filter_limits().max_in_list
        if len(values) > max_in_list:
            raise InvalidFilter(
                f"IN list of {len(values)} values exceeds the limit of {max_in_list} (max_filter_in_list)"
            )
        return [v for v, _ in values], kinds == {False}

    # ---- code: gen(node, True) is TRUE when the node is TRUE; gen(node, False) when it is FALSE --

    def gen(self, node: Tree[Token], pos: bool) -> str:
        kind = node.data
        ch = node.children
        if kind in ("or_", "and_"):
            joiner = " or " if (kind == "or_") == pos else " and "
            return "(" + joiner.join(self.gen(c, pos) for c in ch if isinstance(c, Tree)) + ")"
        if kind == "not_":
            assert isinstance(ch[0], Tree)
            return self.gen(ch[0], not pos)
        if kind in ("true", "false"):
            return str((kind == "true") == pos)
        if kind in ("is_null", "is_not_null"):
            v, _ = self.name(ch[0], False)
            return f"({v} is None)" if (kind == "is_null") == pos else f"({v} is not None)"
        if kind in ("between", "not_between"):
            return self._between(node, pos if kind == "between" else not pos)
        if kind in ("in_", "not_in"):
            return self._in(node, pos if kind == "in_" else not pos)
        return self._cmp(node, pos)

    def _cmp(self, node: Tree[Token], pos: bool) -> str:
        name, op_tok, lit = node.children
        assert isinstance(op_tok, Token)
        assert isinstance(lit, Tree)
        value, tok = _literal(self.expression, lit)
        op = str(op_tok)
        is_num = not isinstance(value, bytes)
        if op not in ("=", "<>") and not is_num:
            raise _fail(self.expression, f"operator {op!r} compares numbers, but {tok!s} is a string", tok)
        v, x = self.name(name, is_num)
        subject = x if is_num else v
        c = self.const(value)
        if op == "<>":
            op, pos = "=", not pos
        if op == "=":
            return f"({subject} == {c})" if pos else f"({subject} is not None and {subject} != {c})"
        negated = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}
        return f"({subject} is not None and {subject} {op if pos else negated[op]} {c})"

    def _between(self, node: Tree[Token], pos: bool) -> str:
        name, lo_node, hi_node = node.children
        assert isinstance(lo_node, Tree)
        assert isinstance(hi_node, Tree)
        for lit in (lo_node, hi_node):
            value, tok = _literal(self.expression, lit)
            if isinstance(value, bytes):
                raise _fail(self.expression, f"BETWEEN compares numbers, but {tok!s} is a string", tok)
        (lo, hi), _ = self.literals([lo_node, hi_node])
        _, x = self.name(name, True)
        a, b = self.const(lo), self.const(hi)
        test = f"{a} <= {x} <= {b}"
        return f"({x} is not None and {test if pos else f'not ({test})'})"

    def _in(self, node: Tree[Token], pos: bool) -> str:
        name, *items = node.children
        values, is_num = self.literals([i for i in items if isinstance(i, Tree)])
        v, x = self.name(name, is_num)
        subject = x if is_num else v
        c = self.const(frozenset(values))
        return f"({subject} in {c})" if pos else f"({subject} is not None and {subject} not in {c})"

    def function(self, tree: Tree[Token], raw: bool = False, positional: bool = False) -> Callable[..., bool]:
        """The filter as one function of a header dict (``raw``: keyed by name bytes), or with
        ``positional`` of the header values themselves, one argument per name (``names`` order)."""
        body = self.gen(tree, True)
        if positional:
            lines = [f"def _f({', '.join(f'v{i}' for i in self.names.values())}):"]
        else:
            lines = ["def _f(h):"]
        for name, i in self.names.items():
            if not positional:
                lines.append(f"    v{i} = h.get({self.const(name.encode() if raw else name)})")
            if i in self.numeric_names:
                lines.append(f"    x{i} = None if v{i} is None else _num(v{i})")
        lines.append(f"    return {body}")
        namespace: dict[str, object] = {"_num": numeric, **self.consts}
        exec(compile("\n".join(lines), "<sql-filter>", "exec"), namespace)  # only constants enter the code
        fn = namespace["_f"]
        assert callable(fn)
        return fn


def _may(node: Tree[Token], pos: bool) -> MayMatch:
    """Whether a batch with a given summary can hold a record for which ``node`` is TRUE (``pos``)
    or FALSE. Conservative: True unless the summary proves otherwise. Built once, run per batch."""
    kind = node.data
    ch = [c for c in node.children if isinstance(c, Tree)]
    if kind in ("or_", "and_"):
        subs = [_may(c, pos) for c in ch]
        if (kind == "or_") == pos:
            return lambda s: any(f(s) for f in subs)
        return lambda s: all(f(s) for f in subs)
    if kind == "not_":
        return _may(ch[0], not pos)
    if kind in ("true", "false"):
        const = (kind == "true") == pos
        return lambda s: const
    return _may_predicate(node, pos)


def _may_predicate(node: Tree[Token], pos: bool) -> MayMatch:
    """``_may`` of a predicate on one header."""
    kind = node.data
    ch = [c for c in node.children if isinstance(c, Tree)]
    name = str(node.children[0])
    present: MayMatch = lambda s: name in s.names  # noqa: E731 - a comparison needs its header
    if kind in ("is_null", "is_not_null"):
        return (lambda s: True) if (kind == "is_null") == pos else present
    equal = (kind == "cmp" and str(node.children[1]) in ("=", "<>")) or kind in ("in_", "not_in")
    if not equal:
        return present
    positive = pos != (kind == "not_in" or str(node.children[1]) == "<>")
    if not positive:
        return present
    keys = []
    for lit in ch:
        tok = lit.children[0]
        assert isinstance(tok, Token)
        value = tok[1:-1].replace("''", "'").encode() if tok.type == "STRING" else numeric(tok.encode())
        assert value is not None
        keys.append(string_key(name, value) if isinstance(value, bytes) else number_key(name, value))
    return lambda s: any(s.may_hold(name, k) for k in keys)


@lru_cache(maxsize=4096)
def compile_sql(expression: str) -> SqlFilter:
    """Parse, type-check and compile ``expression`` (cached: a filter is compiled once per process).

    Raises InvalidFilter with the position of a syntax or type error, or the limit exceeded.
    """
    text = expression.strip()
    tree = _parse(text)
    comp = _Compiler(text)
    fn = comp.function(tree)
    by_position = _Compiler(text)
    positional = by_position.function(tree, positional=True)
    return SqlFilter(
        text,
        fn,
        _may(tree, True),
        frozenset(comp.names),
        bool(fn({})),
        _Compiler(text).function(tree, raw=True),
        tuple(by_position.names),
        positional,
    )


_U16 = struct.Struct("<H").unpack_from
_U32 = struct.Struct("<I").unpack_from


def raw_headers(buf: bytes, p: int, end: int) -> dict[bytes, bytes]:
    """A record's headers blob ``buf[p:end]`` as {name bytes: value}, for ``matches_raw``.

    The broker's per-record cost on a filtered fetch: about 3x cheaper than ``decode_headers`` (no
    name decoding, no memoryview copies, no checks: the broker validated the blob when it was
    produced; a malformed one raises and the caller reports CorruptBatch).
    """
    (count,) = _U16(buf, p)
    p += 2
    out: dict[bytes, bytes] = {}
    for _ in range(count):
        (n,) = _U16(buf, p)
        q = p + 2 + n
        (m,) = _U32(buf, q)
        out[buf[p + 2 : q]] = buf[q + 4 : q + 4 + m]
        p = q + 4 + m
    if p != end:
        raise ValueError("record headers do not fill their blob")
    return out
