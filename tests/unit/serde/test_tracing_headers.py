"""Trace context in record headers: what a producer writes, a consumer reads back; arbitrary headers
(damaged, foreign, not UTF-8) give no context rather than an error."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from sluice.serde.tracing import extract_context, inject_context


@given(
    st.dictionaries(st.sampled_from(["traceparent", "tracestate", "baggage", "x"]), st.binary(max_size=80))
)
def test_arbitrary_headers_never_raise(headers: dict[str, bytes]) -> None:
    ctx = extract_context(headers)
    span_context = trace.get_current_span(ctx).get_span_context()
    assert isinstance(span_context, SpanContext)


@given(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1))
def test_a_written_context_reads_back(trace_id: int, span_id: int) -> None:
    sent = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    mine = {"app": b"x"}
    headers = inject_context(mine, trace.set_span_in_context(NonRecordingSpan(sent)))
    assert mine == {"app": b"x"}  # written into a copy
    assert headers["traceparent"] == f"00-{trace_id:032x}-{span_id:016x}-01".encode()
    got = trace.get_current_span(extract_context(headers)).get_span_context()
    assert (got.trace_id, got.span_id, got.is_remote) == (trace_id, span_id, True)
