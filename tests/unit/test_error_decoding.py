"""One error registry on both sides, and one decoder in the SDK.

- Every ``ErrorCode`` maps to exactly one ``SluiceError`` class and back.
- Every RPC in the proto descriptors: an error a handler raises, encoded by the real server
  interceptor into a gRPC status, comes back from ``error_from_rpc`` as the same class, code and
  message; and every ``Error`` field its responses (or stream events) carry decodes the same way
  through ``error_from_proto``.
- No module of the SDK decodes an error by hand: a static scan of ``sluice/client`` (and the Spark
  source and the CLI, which use the SDK) finds no wire-code comparison, no ``error_for_code``, no
  gRPC status inspection. The decoder lives in ``sluice.errors`` (``error_from_proto``) and
  ``sluice.common.rpc`` (``error_from_rpc``, which hands the status's code to it).
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import pkgutil
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from grpc import aio

import sluice
import sluice.v1
from sluice import errors
from sluice.common.rpc import error_from_rpc, is_unimplemented
from sluice.common.wire import error_from_frame
from sluice.server.interceptors import ServiceInterceptor
from sluice.v1 import common_pb2

_RAISE_KEY = "x-test-raise-code"
_SLUICE = Path(sluice.__file__).parent
#: Packages that must not decode errors themselves (they use the SDK's decoder).
_NO_HAND_DECODING = ("client", "spark", "cli")


def _wire_codes() -> list[int]:
    return [v.number for v in common_pb2.ErrorCode.DESCRIPTOR.values if v.number != common_pb2.NONE]


def _methods() -> list[MethodDescriptor]:
    found = []
    for info in pkgutil.iter_modules(sluice.v1.__path__):
        if info.name.endswith("_pb2"):
            module = importlib.import_module(f"sluice.v1.{info.name}")
            for service in module.DESCRIPTOR.services_by_name.values():
                found.extend(service.methods)
    return found


def _message_class(descriptor: Descriptor) -> Any:
    return message_factory.GetMessageClass(descriptor)


def _message(code: int) -> str:
    return f"refused with {common_pb2.ErrorCode.Name(code)} (code {code})"  # type: ignore[arg-type]


# ---- the registry ------------------------------------------------------------------------


def _all_subclasses(cls: type[errors.SluiceError]) -> Iterator[type[errors.SluiceError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def test_every_error_code_maps_to_exactly_one_class_and_back() -> None:
    reg = errors.registry()
    codes = _wire_codes()
    assert sorted(c for c in reg if c != common_pb2.UNKNOWN) == sorted(
        c for c in codes if c != common_pb2.UNKNOWN
    )
    assert reg[common_pb2.UNKNOWN] is errors.SluiceError
    classes = [reg[c] for c in codes]
    assert len(set(classes)) == len(classes), "a class is registered under two codes"
    for code in codes:
        assert reg[code].code == code
        decoded = errors.error_for_code(code, "m")
        assert type(decoded) is reg[code]
        assert decoded.code == code
    # Back: every class that declares a code is the one registered under it.
    for cls in _all_subclasses(errors.SluiceError):
        if "code" in cls.__dict__:
            assert reg[cls.code] is cls, cls
    # The SDK decides on classes (isinstance), not codes: that is the same decision only when no
    # registered class derives from another registered class.
    for cls in classes:
        for other in classes:
            assert other is cls or not issubclass(cls, other) or other is errors.SluiceError, (cls, other)


# ---- every RPC: a status the server interceptor encodes -----------------------------------


def _handlers(methods: list[MethodDescriptor]) -> list[grpc.GenericRpcHandler[Any, Any]]:
    """A handler for every RPC that raises the error the call's metadata names, as a servicer
    (or the service core under it) raises a domain error."""

    def refusal(context: aio.ServicerContext[Any, Any]) -> errors.SluiceError:
        code = int(dict(context.invocation_metadata() or ())[_RAISE_KEY])
        return errors.error_for_code(code, _message(code))

    by_service: dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]] = {}
    for m in methods:
        request = _message_class(m.input_type)
        response = _message_class(m.output_type)
        assert m.client_streaming == m.server_streaming, (
            f"{m.full_name}: a kind the interceptor passes through"
        )
        if m.client_streaming:

            async def stream(requests: AsyncIterator[Any], context: aio.ServicerContext[Any, Any]) -> Any:
                async for _ in requests:
                    raise refusal(context)
                yield  # pragma: no cover - makes this an async generator

            handler = grpc.stream_stream_rpc_method_handler(
                stream,
                request_deserializer=request.FromString,
                response_serializer=response.SerializeToString,
            )
        else:

            async def unary(_request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
                raise refusal(context)

            handler = grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=request.FromString, response_serializer=response.SerializeToString
            )
        by_service.setdefault(m.containing_service.full_name, {})[m.name] = handler
    return [grpc.method_handlers_generic_handler(name, table) for name, table in by_service.items()]


@pytest.fixture(scope="module")
def refusing_server() -> Iterator[str]:
    """A real grpc.aio server with the real error interceptor, on a loop in a thread."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    address: list[str] = []
    stop = asyncio.Event()

    async def serve() -> None:
        server = aio.server(interceptors=[ServiceInterceptor("error-decoding-test")])
        server.add_generic_rpc_handlers(_handlers(_methods()))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        address.append(f"127.0.0.1:{port}")
        ready.set()
        await stop.wait()
        await server.stop(0)

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10), "the test server did not start"
    try:
        yield address[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


def test_every_rpc_decodes_every_error_the_server_raises(refusing_server: str) -> None:
    methods = _methods()
    assert len(methods) >= 30  # every service's RPCs, not an empty walk
    with grpc.insecure_channel(refusing_server) as channel:
        for m in methods:
            path = f"/{m.containing_service.full_name}/{m.name}"
            request = _message_class(m.input_type)()
            kind = channel.stream_stream if m.client_streaming else channel.unary_unary
            invoke = kind(
                path,
                request_serializer=type(request).SerializeToString,
                response_deserializer=_message_class(m.output_type).FromString,
            )
            for code in _wire_codes():
                metadata = ((_RAISE_KEY, str(code)),)
                with pytest.raises(grpc.RpcError) as caught:
                    _call(invoke, m.client_streaming, request, metadata)
                decoded = error_from_rpc(caught.value)
                expected = errors.registry()[code]
                assert type(decoded) is expected, (m.full_name, code, decoded)
                assert decoded.code == code
                assert decoded.message == _message(code)


def test_a_method_the_server_lacks_is_told_apart_from_a_refusal(refusing_server: str) -> None:
    """The one status the SDK inspects that is not an error code: an older server without the RPC."""
    raw: Any = lambda b: b  # noqa: E731 - bytes in, bytes out
    with grpc.insecure_channel(refusing_server) as channel:
        missing = channel.unary_unary("/sluice.v1.Coordinator/NoSuchMethod", raw, raw)
        with pytest.raises(grpc.RpcError) as caught:
            missing(b"", timeout=10)
        assert is_unimplemented(caught.value)
        refused = channel.unary_unary("/sluice.v1.Coordinator/Heartbeat", raw, raw)
        metadata = ((_RAISE_KEY, str(common_pb2.NOT_COORDINATOR)),)
        with pytest.raises(grpc.RpcError) as caught:
            refused(b"", metadata=metadata, timeout=10)
        assert not is_unimplemented(caught.value)
        assert isinstance(error_from_rpc(caught.value), errors.NotCoordinator)


def _call(invoke: Any, streaming: bool, request: Any, metadata: tuple[tuple[str, str], ...]) -> None:
    if streaming:
        list(invoke(iter([request]), metadata=metadata, timeout=10))
    else:
        invoke(request, metadata=metadata, timeout=10)


# ---- every RPC: Error fields inside answers ------------------------------------------------


def _error_fields(
    descriptor: Descriptor, seen: frozenset[str] = frozenset()
) -> Iterator[list[FieldDescriptor]]:
    """Paths (lists of fields) from a message to each ``sluice.v1.Error`` inside it."""
    for field in descriptor.fields:
        inner = field.message_type
        if inner is None:
            continue  # a scalar field
        if inner.full_name == "sluice.v1.Error":
            yield [field]
        elif inner.full_name not in seen:
            for rest in _error_fields(inner, seen | {descriptor.full_name}):
                yield [field, *rest]


def _set_error(message: Any, path: list[FieldDescriptor], error: common_pb2.Error) -> None:
    *outer, last = path
    for field in outer:
        message = getattr(message, field.name).add() if field.is_repeated else getattr(message, field.name)
    if last.is_repeated:
        getattr(message, last.name).add().CopyFrom(error)
    else:
        getattr(message, last.name).CopyFrom(error)


def _get_error(message: Any, path: list[FieldDescriptor]) -> common_pb2.Error:
    for field in path:
        value = getattr(message, field.name)
        message = value[0] if field.is_repeated else value
    error: common_pb2.Error = message
    return error


def test_every_error_field_of_every_answer_decodes_to_its_class() -> None:
    walked = 0
    for m in _methods():
        response_class = _message_class(m.output_type)
        for path in _error_fields(m.output_type):
            for code in _wire_codes():
                raised = errors.error_for_code(code, _message(code))
                answer = response_class()
                _set_error(answer, path, raised.to_proto())  # as the adapters encode a domain error
                received = response_class.FromString(answer.SerializeToString())
                decoded = errors.error_from_proto(_get_error(received, path))
                assert type(decoded) is type(raised), (m.full_name, [f.name for f in path], code)
                assert decoded.code == code
                assert decoded.message == raised.message
            answer = response_class()
            _set_error(answer, path, common_pb2.Error())  # an item without an error
            empty = _get_error(response_class.FromString(answer.SerializeToString()), path)
            assert errors.error_from_proto(empty) is None
            walked += 1
    # Produce, Fetch, ListOffsets, commits, the group stream, the push stream...
    assert walked >= 10


def test_wire_error_frames_and_hello_refusals_decode_the_same_way() -> None:
    for code in _wire_codes():
        raised = errors.error_for_code(code, _message(code))
        decoded = error_from_frame(raised.to_proto().SerializeToString(), "broker-1")
        assert type(decoded) is type(raised)
        assert decoded.message == f"broker-1 closed the connection: {_message(code)}"
        with pytest.raises(type(raised), match="refused with"):
            errors.raise_for_proto(raised.to_proto())


# ---- no decoding by hand -----------------------------------------------------------------

_ERROR_CODE_NAMES = frozenset(common_pb2.ErrorCode.keys())


def hand_decoding(source: str) -> list[str]:
    """What in ``source`` decodes an error without the one decoder (empty: nothing)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute):
            if node.attr == "code":
                found.append(f"{where}: reads an error code (.code)")
            elif node.attr == "StatusCode":
                found.append(f"{where}: inspects a gRPC status (StatusCode)")
            elif (
                node.attr in _ERROR_CODE_NAMES and isinstance(node.value, ast.Name) and "pb2" in node.value.id
            ):
                found.append(f"{where}: names a wire code ({node.value.id}.{node.attr})")
            elif node.attr == "error_for_code":
                found.append(f"{where}: maps a code itself (error_for_code)")
        elif isinstance(node, ast.Name) and node.id == "error_for_code":
            found.append(f"{where}: maps a code itself (error_for_code)")
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                wire_code = alias.name in _ERROR_CODE_NAMES and "pb2" in (node.module or "")
                if alias.name == "error_for_code" or wire_code:
                    found.append(f"{where}: imports {alias.name}")
    return found


def test_the_scan_finds_the_hand_decoding_it_forbids() -> None:
    assert hand_decoding("if r.error.code != common_pb2.NONE:\n    raise error_for_code(r.error.code, '')\n")
    assert hand_decoding("x = exc.code() == grpc.StatusCode.UNIMPLEMENTED\n")
    assert hand_decoding("RETRY = {common_pb2.NOT_LEADER}\n")
    assert hand_decoding("from sluice.errors import error_for_code\n")
    assert not hand_decoding("err = error_from_proto(r.error)\nif isinstance(err, NotLeader):\n    pass\n")


def test_no_sdk_module_decodes_errors_by_hand() -> None:
    offenders = {}
    scanned = 0
    for package in _NO_HAND_DECODING:
        for path in sorted((_SLUICE / package).rglob("*.py")):
            scanned += 1
            found = hand_decoding(path.read_text())
            if found:
                offenders[str(path.relative_to(_SLUICE))] = found
    assert scanned > 40
    assert offenders == {}, "decode through sluice.errors.error_from_proto / sluice.common.rpc.error_from_rpc"


def test_no_dispatcher_module_decodes_errors_by_hand() -> None:
    """The dispatcher is a client too (brokers, the offset store, the coordinator): its feeds, cursor
    store and registry decide on error classes from the one decoder, as the SDK does."""
    offenders = {}
    paths = sorted((_SLUICE / "dispatcher").rglob("*.py"))
    for path in paths:
        found = hand_decoding(path.read_text())
        if found:
            offenders[str(path.relative_to(_SLUICE))] = found
    assert len(paths) > 20
    assert offenders == {}, "decode through sluice.errors.error_from_proto / sluice.common.rpc.error_from_rpc"
