"""OpenTelemetry tracing through record headers (the ``otel`` extra; docs/tracing.md).

The producer (``ProducerConfig.tracing=True``) starts a PRODUCER span per ``send()`` that ends when the
broker acknowledges the record (or it fails), and writes the span's context into the record's headers
with the configured propagators (W3C ``traceparent`` / ``tracestate`` by default). A consumer -- group or
push, sync or asyncio -- opens the processing span with :func:`process_span`, a child of the producer's
span extracted from the record's headers; :func:`extract_context` gives the bare context.

opentelemetry is imported only here and only when used: the SDK works without it, and asking for
tracing without it raises SerdeExtraMissing naming the extra.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from sluice.errors import SerdeExtraMissing

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

__all__ = ["INSTRUMENTATION", "SendTracer", "extract_context", "inject_context", "process_span"]

#: The instrumentation scope name of Sluice's spans.
INSTRUMENTATION = "sluice"


class _Traced(Protocol):
    """A consumed record or push message: what a processing span reads."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, bytes]: ...


def _otel() -> Any:
    try:
        from opentelemetry import propagate, trace
    except ImportError:
        raise SerdeExtraMissing("tracing needs OpenTelemetry: pip install 'sluice[otel]'") from None
    return propagate, trace


class _HeaderSetter:
    """Writes propagation fields as header values (UTF-8 bytes)."""

    def set(self, carrier: dict[str, bytes], key: str, value: str) -> None:
        carrier[key] = value.encode("utf-8")


class _HeaderGetter:
    def get(self, carrier: Mapping[str, bytes], key: str) -> list[str] | None:
        raw = carrier.get(key)
        if raw is None:
            return None
        try:
            return [raw.decode("utf-8")]
        except UnicodeDecodeError:
            return None  # a damaged header is no context, not an error of the record

    def keys(self, carrier: Mapping[str, bytes]) -> list[str]:
        return list(carrier)


_SETTER = _HeaderSetter()
_GETTER = _HeaderGetter()


def inject_context(headers: Mapping[str, bytes] | None, context: Context | None = None) -> dict[str, bytes]:
    """A copy of ``headers`` with ``context`` (default: the current one) written in by the configured
    propagators (W3C ``traceparent`` / ``tracestate`` by default)."""
    propagate, _ = _otel()
    carrier = dict(headers) if headers else {}
    propagate.inject(carrier, context=context, setter=_SETTER)
    return carrier


def extract_context(headers: Mapping[str, bytes] | None) -> Context:
    """The trace context a producer wrote into ``headers`` (an empty context when there is none)."""
    propagate, _ = _otel()
    return propagate.extract(headers or {}, getter=_GETTER)  # type: ignore[no-any-return]


@contextlib.contextmanager
def process_span(record: _Traced, name: str | None = None) -> Iterator[Span]:
    """``with process_span(record):`` -- the CONSUMER span of processing one record or push message, a
    child of the span that sent it. An exception leaving the block is recorded on the span."""
    _, trace = _otel()
    tracer = trace.get_tracer(INSTRUMENTATION)
    with tracer.start_as_current_span(
        name or f"{record.topic} process",
        context=extract_context(record.headers),
        kind=trace.SpanKind.CONSUMER,
        attributes={
            "messaging.system": "sluice",
            "messaging.operation.type": "process",
            "messaging.destination.name": record.topic,
            "messaging.destination.partition.id": str(record.partition),
            "messaging.sluice.offset": record.offset,
        },
    ) as span:
        yield span


class SendTracer:
    """The producer's side: one PRODUCER span per send, its context injected into the headers."""

    def __init__(self, topic: str) -> None:
        _, self._trace = _otel()
        self._tracer = self._trace.get_tracer(INSTRUMENTATION)
        self._topic = topic

    def send(self, send: Callable[..., Any], value: Any, key: Any, headers: Any, **kw: Any) -> Any:
        """``send(value, key, headers=..., **kw)`` inside a span whose context travels in a copy of
        ``headers``; the span ends when the returned future completes."""
        trace = self._trace
        span = self._tracer.start_span(
            f"{self._topic} publish",
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": "sluice",
                "messaging.operation.type": "send",
                "messaging.destination.name": self._topic,
            },
        )
        carrier = inject_context(headers, trace.set_span_in_context(span))  # a copy: the caller's is kept
        try:
            future = send(value, key, headers=carrier, **kw)
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
            span.end()
            raise
        future.add_done_callback(lambda f: self._done(span, f))
        return future

    def _done(self, span: Span, future: Any) -> None:
        error = future.exception(0)
        if error is None:
            meta = future.result(0)
            span.set_attribute("messaging.destination.partition.id", str(meta.partition))
            span.set_attribute("messaging.sluice.offset", meta.offset)
        else:
            span.record_exception(error)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(error)))
        span.end()
