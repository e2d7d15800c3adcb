"""OpenTelemetry through record headers against a real stack: the producer's span context reaches the
group consumer's and the push consumer's processing spans, recorded by the SDK's in-memory exporter."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sluice import Client
from sluice.errors import SerializationError
from sluice.serde.tracing import process_span

_EXPORTER = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    # The global provider can be set once per process; this module's is the SDK's, with the exporter.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(_PROVIDER)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def _place(span: ReadableSpan) -> tuple[str, int]:
    attrs = span.attributes or {}
    return str(attrs["messaging.destination.partition.id"]), int(attrs["messaging.sluice.offset"])  # type: ignore[arg-type]


def _by_kind(exporter: InMemorySpanExporter, kind: trace.SpanKind) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind is kind]


def test_producer_context_reaches_group_and_push_processing_spans(
    client: Client, new_topic: Callable[..., str], spans: InMemorySpanExporter
) -> None:
    topic = new_topic(partitions=2)
    tracer = trace.get_tracer("test")
    n = 6
    with client.push_consumer(
        topic, "s", "shared", initial_position="earliest", value_deserializer="json"
    ) as pc:
        with (
            tracer.start_as_current_span("request") as request,
            client.producer(topic, tracing=True, value_serializer="json") as producer,
        ):
            futures = [producer.send({"i": i}, headers={"app": b"x"}) for i in range(n)]
            producer.flush()
            metas = [f.result(0) for f in futures]
        sent = _by_kind(spans, trace.SpanKind.PRODUCER)
        assert len(sent) == n  # every send span ended, at its acknowledgement
        for s in sent:
            assert s.parent is not None
            assert s.parent.span_id == request.get_span_context().span_id
            assert s.name == f"{topic} publish"
        by_place = {_place(s): s for s in sent}
        assert set(by_place) == {(str(m.partition), m.offset) for m in metas}

        def check(place: tuple[str, int], process: ReadableSpan) -> None:
            sender = by_place[place]
            assert process.context is not None
            assert sender.context is not None
            assert process.context.trace_id == sender.context.trace_id
            assert process.parent is not None
            assert process.parent.span_id == sender.context.span_id

        # Push: the processing span is the child of the send span of that very message.
        got = 0
        deadline = time.monotonic() + 20
        while got < n and time.monotonic() < deadline:
            msg = pc.receive(timeout=1.0)
            assert msg.headers["app"] == b"x"
            assert msg.headers["traceparent"].startswith(b"00-")
            with process_span(msg):
                pass
            check((str(msg.partition), msg.offset), _by_kind(spans, trace.SpanKind.CONSUMER)[-1])
            pc.ack(msg)
            got += 1
        assert got == n

    # Group consumer: the same, and an exception in processing is recorded on the span.
    seen = 0
    with client.consumer(f"g-{uuid.uuid4().hex[:8]}", topic, auto_offset_reset="earliest") as consumer:
        deadline = time.monotonic() + 20
        while seen < n and time.monotonic() < deadline:
            for record in consumer.poll(timeout=0.5):
                with pytest.raises(RuntimeError), process_span(record):
                    raise RuntimeError("handler failed")
                span = _by_kind(spans, trace.SpanKind.CONSUMER)[-1]
                check((str(record.partition), record.offset), span)
                assert span.status.status_code is trace.StatusCode.ERROR
                seen += 1
    assert seen == n


def test_a_send_that_fails_ends_its_span_with_the_error(
    client: Client, new_topic: Callable[..., str], spans: InMemorySpanExporter
) -> None:
    topic = new_topic()
    with (
        client.producer(topic, tracing=True, value_serializer="json") as producer,
        pytest.raises(SerializationError),
    ):
        producer.send(object())
    [span] = _by_kind(spans, trace.SpanKind.PRODUCER)
    assert span.status.status_code is trace.StatusCode.ERROR
