"""OpenTelemetry traces of one request: frontend -> router -> worker -> engine.

Off by default, and then free: nothing of OpenTelemetry is imported, ``span`` and
``start_span`` return one shared no-op object after one check, and ``traceparent`` is None.
``interlock serve``, ``frontend`` and ``worker`` turn it on with ``--tracing`` (or
``INTERLOCK_TRACING=1``; ``serve`` hands it to its workers), which needs the OpenTelemetry SDK
(``pip install opentelemetry-sdk``). Spans go to an OTLP collector when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, which needs
``opentelemetry-exporter-otlp`` (http/protobuf, or gRPC with ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``;
the exporter reads the other standard ``OTEL_*`` variables itself), else to stderr as JSON.

The spans of one request, one trace (docs/design.md, "Traces"; docs/deploy.md):

  http <endpoint>     frontend, the root (or the child of the client's ``traceparent`` header):
                      request id, model, status, prompt and completion tokens
    route             each routing decision (retries, migrations and both legs of a
                      disaggregated request make more): worker, reason, overlap blocks, predicted
                      cached tokens, candidates
    worker.generate   a worker serving one leg: worker id, finish reason, tokens
      engine          Interlock's engine, from submit to the last token; event ``first_token``
      kv.transfer     a disaggregated decode pulling its prompt's KV: bytes, transport, outcome

Across processes a span's context travels as a W3C ``traceparent`` string
(``GenerateRequest.traceparent``, set by the router, read by the worker). Within a process the
frontend's span is the current one (a context variable) while the router routes; spans that
live across an async generator's ``yield`` (worker, engine, transfer) are never made current
(a generator may be closed from another context) and are parented explicitly instead.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

SDK_PACKAGE = "opentelemetry-sdk"
OTLP_PACKAGE = "opentelemetry-exporter-otlp"

Attributes = Mapping[str, str | int | float | bool]


class Span(Protocol):
    """What the callers use of a span (OpenTelemetry's, or the no-op one)."""

    def set_attribute(self, key: str, value: Any) -> None: ...
    def set_attributes(self, attributes: Any) -> None: ...
    def add_event(self, name: str, attributes: Any = None) -> None: ...
    def is_recording(self) -> bool: ...
    def end(self) -> None: ...


class _NoSpan:
    """The span of tracing off: every call does nothing."""

    __slots__ = ()

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_attributes(self, attributes: Any) -> None:
        pass

    def add_event(self, name: str, attributes: Any = None) -> None:
        pass

    def is_recording(self) -> bool:
        return False

    def end(self) -> None:
        pass

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


NO_SPAN = _NoSpan()
"""The one no-op span (and its own context manager)."""


class TracingUnavailable(Exception):
    """``--tracing`` was asked for and a package it needs is not installed."""


class _State:
    __slots__ = ("tracer", "provider", "propagator")

    def __init__(self) -> None:
        self.tracer: Any = None
        """OpenTelemetry's tracer while tracing is on; None: off."""
        self.provider: Any = None
        self.propagator: Any = None


_state = _State()


def enabled() -> bool:
    return _state.tracer is not None


def configure(
    enabled: bool, service_name: str = "interlock", *, exporter: Any = None, otlp: str | None = None
) -> None:
    """Turn tracing on (or off: the previous provider is flushed and shut down).

    ``exporter``: an OpenTelemetry ``SpanExporter`` fed span by span (tests: the SDK's
    ``InMemorySpanExporter``); else ``otlp``: "http/protobuf" or "grpc" to the standard
    ``OTEL_EXPORTER_OTLP_*`` endpoint, or None: JSON on stderr, both batched. Raises
    ``TracingUnavailable`` naming the package to install."""
    shutdown()
    if not enabled:
        return
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        raise TracingUnavailable(
            f"--tracing needs the OpenTelemetry SDK: pip install {SDK_PACKAGE}"
        ) from None
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        provider.add_span_processor(BatchSpanProcessor(_exporter(otlp)))
    _state.provider = provider
    _state.propagator = TraceContextTextMapPropagator()
    _state.tracer = provider.get_tracer("interlock")


def _exporter(otlp: str | None) -> Any:
    if otlp is None:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=sys.stderr)
    try:
        if otlp == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[assignment]
                OTLPSpanExporter,
            )
    except ImportError:
        raise TracingUnavailable(
            f"OTEL_EXPORTER_OTLP_ENDPOINT is set: sending traces there needs pip install {OTLP_PACKAGE}"
        ) from None
    return OTLPSpanExporter()


def shutdown() -> None:
    """Flush and stop the exporter; tracing is off afterwards."""
    provider = _state.provider
    _state.tracer = _state.provider = _state.propagator = None
    if provider is not None:
        provider.shutdown()


def span(name: str, *, parent: str | None = None, attributes: Attributes | None = None) -> Any:
    """A context manager: a span made current for its block (a child of ``parent``, a
    ``traceparent`` string, if given, else of the current span). Only where the block holds no
    ``yield``: see the module docstring."""
    tracer = _state.tracer
    if tracer is None:
        return NO_SPAN
    return _current(tracer, name, parent, attributes)


@contextmanager
def _current(tracer: Any, name: str, parent: str | None, attributes: Attributes | None) -> Iterator[Span]:
    with tracer.start_as_current_span(name, context=_context(parent), attributes=attributes) as s:
        yield s


def start_span(name: str, *, parent: str | None = None, attributes: Attributes | None = None) -> Span:
    """A span that is not made current; the caller ends it (``Span.end``). Its parent is
    ``parent`` (a ``traceparent``), else the current span."""
    tracer = _state.tracer
    if tracer is None:
        return NO_SPAN
    s: Span = tracer.start_span(name, context=_context(parent), attributes=attributes)
    return s


def _context(parent: str | None) -> Any:
    if parent is None:
        return None
    return _state.propagator.extract({"traceparent": parent})


def traceparent(of: Span | None = None) -> str | None:
    """The W3C ``traceparent`` of ``of`` (default: the current span); None when off or none."""
    if _state.tracer is None or (of is not None and not of.is_recording()):
        return None
    from opentelemetry import trace

    carrier: dict[str, str] = {}
    context = trace.set_span_in_context(of) if of is not None else None  # type: ignore[arg-type]
    _state.propagator.inject(carrier, context=context)
    return carrier.get("traceparent")
