"""OpenTelemetry tracing of queueworks (the ``otel`` extra): ``QueueworksInstrumentor``.

Spans follow the OpenTelemetry semantic conventions for messaging (version 1.44.0, status
"development"):

- ``send <queue>`` (PRODUCER) around ``Queue.enqueue``/``enqueue_many`` and their asyncio
  twins (``messaging.batch.message_count`` for a batch), and ``send <task>`` around
  ``Client.submit``/``AsyncClient.submit``; the enqueued job carries the span's context
  (W3C ``traceparent``, ``tracestate`` and ``baggage``: ``queueworks.tracing``);
- ``process <queue>`` (CONSUMER) around each run of a job's handler on a worker, a child of
  the producer's span (a span link instead, for a job that waited for dependencies); the
  handler runs with it current, so its own spans (HTTP, database) nest under it. A failure
  sets status ERROR with an ``exception`` event; a retry, a dead letter and a cancellation
  while it ran are span events.

Attributes: ``messaging.system`` ("queueworks"), ``messaging.operation.name`` and
``.type``, ``messaging.destination.name`` (the queue), ``messaging.message.id`` (the job's
id), ``messaging.client.id`` (the worker's id) and ``queueworks.job.attempt``,
``queueworks.job.handler``.

``queueworks worker --otel`` and ``queueworks controller --otel`` call ``setup``: the SDK
from the standard ``OTEL_*`` variables, then the instrumentor. Elsewhere (a web service
that enqueues) instrument as any OpenTelemetry library: ``QueueworksInstrumentor().
instrument()`` after the SDK is set up, or ``opentelemetry-instrument`` (the entry point
``opentelemetry_instrumentor``).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Collection, MutableMapping
from contextlib import AbstractContextManager
from contextvars import Token
from functools import wraps
from typing import Any

from opentelemetry import baggage, context, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)
from opentelemetry.instrumentation.utils import unwrap
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from wrapt import wrap_function_wrapper

from queueworks.tracing import LINK_FIELD, TRACE_FIELDS, hooks

SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"
SUBTASK_SPANS = "QUEUEWORKS_OTEL_SUBTASK_SPANS"  # 1: --otel traces each subtask too
SYSTEM = "queueworks"
# attribute names (semantic conventions 1.44.0, messaging; the last two are queueworks')
SYSTEM_ATTR = "messaging.system"
OPERATION_NAME = "messaging.operation.name"
OPERATION_TYPE = "messaging.operation.type"
DESTINATION = "messaging.destination.name"
MESSAGE_ID = "messaging.message.id"
CLIENT_ID = "messaging.client.id"
BATCH_COUNT = "messaging.batch.message_count"
ERROR_TYPE = "error.type"
ATTEMPT = "queueworks.job.attempt"
HANDLER = "queueworks.job.handler"

# what a job carries is W3C's, whatever OTEL_PROPAGATORS says for HTTP
_PROPAGATOR = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])


def _merge(options: str, fields: dict[str, Any]) -> str:
    """A job's options JSON (``o``; '' for none) with ``fields`` added."""
    extra = json.dumps(fields, separators=(",", ":"))
    if not options:
        return extra
    return f"{options[:-1]},{extra[1:]}"


_FLAGS = [format(flags, "02x") for flags in range(256)]  # a traceparent's trace-flags


class Producer:
    """``hooks.producer``: the current context into a new job's options, as the W3C
    propagators write it (``traceparent`` made here: it is on every traced enqueue)."""

    def carry(self, options: str) -> str:
        ctx = context.get_current()
        span_context = trace.get_current_span(ctx).get_span_context()
        if not span_context.is_valid:
            return options
        flags = _FLAGS[span_context.trace_flags]  # (formatting a TraceFlags itself is slow)
        tp = f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{flags}"
        fields = {"tp": tp}
        if span_context.trace_state:
            fields["ts"] = span_context.trace_state.to_header()
        if baggage.get_all(ctx):
            carrier: dict[str, str] = {}
            W3CBaggagePropagator().inject(carrier, ctx)
            if "baggage" in carrier:
                fields["bg"] = carrier["baggage"]
        if not options and len(fields) == 1:
            return '{"tp":"' + tp + '"}'
        return _merge(options, fields)

    def as_link(self, options: str) -> str:
        if '"tp":' not in options:
            return options
        return _merge(options, {LINK_FIELD: 1})


_TRACEPARENT = re.compile(r'"tp":"(00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2})"')


def carried(options: str | None) -> tuple[dict[str, str], bool]:
    """The W3C headers a job's options carry, and whether its consumer links to them."""
    if not options or '"tp":' not in options:
        return {}, False
    if '"ts":' not in options and '"bg":' not in options:  # as ``Producer.carry`` writes
        found_tp = _TRACEPARENT.search(options)
        if found_tp is not None:
            return {"traceparent": found_tp.group(1)}, f'"{LINK_FIELD}":1' in options
    try:
        found = json.loads(options)
    except ValueError:
        return {}, False
    if not isinstance(found, dict):
        return {}, False
    headers = {h: v for n, h in TRACE_FIELDS.items() if isinstance(v := found.get(n), str)}
    return headers, found.get(LINK_FIELD) == 1


def remote(headers: dict[str, str]) -> context.Context:
    """The context a job carries (``carried``): its producer's span, remote, and baggage.
    A ``traceparent`` as ``Producer.carry`` writes it is read here; anything else (a
    ``tracestate``, baggage, another form) by the W3C propagators."""
    if len(headers) == 1:
        tp = headers["traceparent"]
        trace_id, span_id = int(tp[3:35], 16), int(tp[36:52], 16)
        if tp[:3] == "00-" and trace_id and span_id:
            flags = TraceFlags(int(tp[53:55], 16))
            span = NonRecordingSpan(SpanContext(trace_id, span_id, True, flags))
            return trace.set_span_in_context(span, context.Context())
    return _PROPAGATOR.extract(headers, context.Context())


class Consumer:
    """``hooks.consumer``: a ``process <queue>`` span per run of a job's handler, and one
    per batch of a task's subtasks (and, with ``subtask_spans``, one per subtask in it)."""

    def __init__(self, tracer: trace.Tracer, subtask_spans: bool = False) -> None:
        self.tracer, self.subtask_spans = tracer, subtask_spans
        self.wrapped: dict[Callable[..., Any], Callable[..., Any]] = {}  # per handler
        self.per_subtask: dict[tuple[Callable[..., Any], str], Callable[..., Any]] = {}

    def start(self, job: Any, queue: str, worker_id: str) -> None:
        entry = job.entry
        headers, link = carried(entry.options)
        parent = remote(headers) if headers else None
        links: list[Link] = []
        if link and parent is not None:
            linked = trace.get_current_span(parent).get_span_context()
            links, parent = [Link(linked)], context.Context()
        span = self.tracer.start_span(
            f"process {queue}",
            context=parent if parent is not None else context.Context(),
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                SYSTEM_ATTR: SYSTEM,
                OPERATION_NAME: "process",
                OPERATION_TYPE: "process",
                DESTINATION: queue,
                MESSAGE_ID: entry.job_id,
                CLIENT_ID: worker_id,
                ATTEMPT: job.attempt,
                HANDLER: entry.handler,
            },
        )
        job.span = span
        job.fn, job.args = self._traced(job.fn), (span, *job.args)

    def _traced(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` run with the span it is given first current (made once per handler)."""
        found = self.wrapped.get(fn)
        if found is not None:
            return found
        if _is_coroutine_function(fn):

            @wraps(fn)
            async def traced_async(span: trace.Span, *args: Any) -> Any:
                token = context.attach(trace.set_span_in_context(span))
                try:
                    return await fn(*args)
                finally:
                    context.detach(token)

            found = traced_async
        else:

            @wraps(fn)
            def traced(span: trace.Span, *args: Any) -> Any:
                token = context.attach(trace.set_span_in_context(span))
                try:
                    return fn(*args)
                finally:
                    context.detach(token)

            found = traced
        self.wrapped[fn] = found
        return found

    def attached(self, job: Any) -> AbstractContextManager[Any]:
        return _Current(job.span)

    def batch(
        self, task: str, carried_options: str | None, count: int, worker_id: str
    ) -> AbstractContextManager[Any]:
        headers, _ = carried(carried_options)
        parent = remote(headers) if headers else context.Context()
        span = self.tracer.start_span(
            f"process {task}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                SYSTEM_ATTR: SYSTEM,
                OPERATION_NAME: "process",
                OPERATION_TYPE: "process",
                DESTINATION: task,
                BATCH_COUNT: count,
                CLIENT_ID: worker_id,
            },
        )
        return trace.use_span(span, end_on_exit=True)

    def subtask_fn(self, fn: Callable[..., Any], task: str) -> Callable[..., Any] | None:
        if not self.subtask_spans:
            return None
        found = self.per_subtask.get((fn, task))
        if found is not None:
            return found
        tracer, name = self.tracer, f"process {task}"

        def opened(args: tuple[Any, ...]) -> AbstractContextManager[trace.Span]:
            attributes: dict[str, Any] = {
                SYSTEM_ATTR: SYSTEM,
                OPERATION_NAME: "process",
                OPERATION_TYPE: "process",
                DESTINATION: task,
            }
            ctx = args[1] if len(args) > 1 else None
            if ctx is not None and hasattr(ctx, "index"):
                attributes.update({MESSAGE_ID: str(ctx.index), ATTEMPT: ctx.attempt})
            return tracer.start_as_current_span(name, kind=SpanKind.CONSUMER, attributes=attributes)

        if _is_coroutine_function(fn):

            @wraps(fn)
            async def each_async(*args: Any) -> Any:
                with opened(args):
                    return await fn(*args)

            found = each_async
        else:

            @wraps(fn)
            def each(*args: Any) -> Any:
                with opened(args):
                    return fn(*args)

            found = each
        self.per_subtask[(fn, task)] = found
        return found

    def trace_id(self, job: Any) -> str:
        return format(job.span.get_span_context().trace_id, "032x")

    def end(self, job: Any, error: BaseException | None, fate: str) -> None:
        span: trace.Span = job.span
        if fate == "suspended":
            span.add_event("suspended")
        elif fate in ("cancelled", "stopped"):  # no failure of its own: nothing recorded
            span.add_event(fate, {"queueworks.job.reason": str(job.stop)})
        elif error is not None:
            span.record_exception(error)
            span.set_attribute(ERROR_TYPE, type(error).__qualname__)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        if fate == "retry":
            span.add_event("retry", {ATTEMPT: job.attempt})
        elif fate == "dead":
            if error is None:
                span.set_attribute(ERROR_TYPE, "dead")
                span.set_status(Status(StatusCode.ERROR, job.reason))
            span.add_event("dead_letter", {"queueworks.job.reason": job.reason})
        span.end()


class _Current:
    """``span`` current inside (and not ended after): ``use_span`` without its generator."""

    __slots__ = ("ctx", "token")

    def __init__(self, span: trace.Span) -> None:
        self.ctx = trace.set_span_in_context(span)

    def __enter__(self) -> None:
        self.token = context.attach(self.ctx)

    def __exit__(self, *exc: object) -> None:
        context.detach(self.token)


def _is_coroutine_function(fn: Callable[..., Any]) -> bool:
    import inspect

    return inspect.iscoroutinefunction(fn)


def log_fields(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A structlog processor: ``trace_id`` and ``span_id`` of the span current, if any."""
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        event.setdefault("trace_id", format(span_context.trace_id, "032x"))
        event.setdefault("span_id", format(span_context.span_id, "016x"))
    return event


# -- the clients' producer spans ------------------------------------------------------------

_CLIENT_METHODS = [
    ("queueworks.client.queue_handle", "Queue.enqueue", False, False),
    ("queueworks.client.queue_handle", "Queue.enqueue_many", False, True),
    ("queueworks.client.aio_queue_handle", "AsyncQueue.enqueue", True, False),
    ("queueworks.client.aio_queue_handle", "AsyncQueue.enqueue_many", True, True),
]
_SUBMITS = [
    ("queueworks.client.sync", "Client.submit", False),
    ("queueworks.client.aio", "AsyncClient.submit", True),
]


_CANCELS = [
    ("queueworks.client.queue_handle", "Job.cancel", False),
    ("queueworks.client.aio_queue_handle", "AsyncJob.cancel", True),
]


def _cancel_wrapper(tracer: trace.Tracer, is_async: bool) -> Callable[..., Any]:
    """``cancel <queue>`` (CLIENT) around ``job.cancel()``; a ``cancelled`` event if it
    cancelled the job (one that has not started: it has no ``process`` span)."""

    def opened(instance: Any) -> AbstractContextManager[trace.Span]:
        attributes = {
            SYSTEM_ATTR: SYSTEM,
            OPERATION_NAME: "cancel",
            OPERATION_TYPE: "settle",
            DESTINATION: instance.queue.name,
            MESSAGE_ID: instance.id,
        }
        name = f"cancel {instance.queue.name}"
        return tracer.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=attributes)

    if is_async:

        async def cancel_async(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            with opened(instance) as span:
                done = await wrapped(*args, **kwargs)
                if done:
                    span.add_event("cancelled")
                return done

        return cancel_async

    def cancel(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        with opened(instance) as span:
            done = wrapped(*args, **kwargs)
            if done:
                span.add_event("cancelled")
            return done

    return cancel


def _send_attributes(destination: str) -> dict[str, Any]:
    return {
        SYSTEM_ATTR: SYSTEM,
        OPERATION_NAME: "send",
        OPERATION_TYPE: "send",
        DESTINATION: destination,
    }


def _sent(span: trace.Span, result: Any, many: bool) -> None:
    if many:
        span.set_attribute(BATCH_COUNT, len(result))
    else:
        span.set_attribute(MESSAGE_ID, result.id)


class _Sends:
    """Each queue's ``send`` span name and attributes, made once (at most ``KEPT``)."""

    KEPT = 1024

    def __init__(self) -> None:
        self.made: dict[str, tuple[str, dict[str, Any]]] = {}

    def __call__(self, queue: str) -> tuple[str, dict[str, Any]]:
        found = self.made.get(queue)
        if found is None:
            if len(self.made) >= self.KEPT:
                self.made.clear()
            found = self.made[queue] = (f"send {queue}", _send_attributes(queue))
        return found


def _enqueue_wrapper(tracer: trace.Tracer, is_async: bool, many: bool) -> Callable[..., Any]:
    """A ``send`` span, current while the enqueue runs (its jobs carry it): made, made
    current and ended by hand, the hot path of a traced producer (what
    ``start_as_current_span`` does, without its two generator-based context managers)."""
    sends = _Sends()

    def opened(instance: Any) -> tuple[trace.Span, Token[context.Context]]:
        name, attributes = sends(instance.name)
        span = tracer.start_span(name, kind=SpanKind.PRODUCER, attributes=attributes)
        return span, context.attach(trace.set_span_in_context(span))

    def failed(span: trace.Span, error: BaseException) -> None:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))

    if is_async:

        async def send_async(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            span, token = opened(instance)
            try:
                result = await wrapped(*args, **kwargs)
                _sent(span, result, many)
                return result
            except BaseException as error:
                failed(span, error)
                raise
            finally:
                context.detach(token)
                span.end()

        return send_async

    def send(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        span, token = opened(instance)
        try:
            result = wrapped(*args, **kwargs)
            _sent(span, result, many)
            return result
        except BaseException as error:
            failed(span, error)
            raise
        finally:
            context.detach(token)
            span.end()

    return send


def _submit_wrapper(tracer: trace.Tracer, is_async: bool) -> Callable[..., Any]:
    def opened(args: Any, kwargs: Any) -> trace.Span:
        spec = args[0] if args else kwargs.get("spec")
        name = getattr(spec, "name", "task")
        attributes = _send_attributes(name)
        attributes[BATCH_COUNT] = len(getattr(spec, "subtasks", None) or ())
        return tracer.start_span(f"send {name}", kind=SpanKind.PRODUCER, attributes=attributes)

    if is_async:

        async def submit_async(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            with trace.use_span(opened(args, kwargs), end_on_exit=True) as span:
                task = await wrapped(*args, **kwargs)
                span.set_attribute(MESSAGE_ID, task.id)
                return task

        return submit_async

    def submit(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        with trace.use_span(opened(args, kwargs), end_on_exit=True) as span:
            task = wrapped(*args, **kwargs)
            span.set_attribute(MESSAGE_ID, task.id)
            return task

    return submit


class QueueworksInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Traces the clients' enqueues and submits (``send``) and a worker's jobs
    (``process``); adds ``trace_id``/``span_id`` to log lines written under a span.
    ``instrument(subtask_spans=True)``: a span per subtask too, under its batch's."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()  # queueworks itself: nothing else to be present

    def _instrument(self, **kwargs: Any) -> None:
        from queueworks import __version__

        tracer = trace.get_tracer(
            __name__,
            __version__,
            tracer_provider=kwargs.get("tracer_provider"),
            schema_url=SCHEMA_URL,
        )
        for module, name, is_async, many in _CLIENT_METHODS:
            wrap_function_wrapper(module, name, _enqueue_wrapper(tracer, is_async, many))
        for module, name, is_async in _SUBMITS:
            wrap_function_wrapper(module, name, _submit_wrapper(tracer, is_async))
        for module, name, is_async in _CANCELS:
            wrap_function_wrapper(module, name, _cancel_wrapper(tracer, is_async))
        hooks.producer = Producer()
        hooks.consumer = Consumer(tracer, bool(kwargs.get("subtask_spans", False)))
        hooks.log_fields = log_fields

    def _uninstrument(self, **kwargs: Any) -> None:
        hooks.producer = hooks.consumer = hooks.log_fields = None
        methods = [(m, n) for m, n, *_ in _CLIENT_METHODS]
        methods += [(m, n) for m, n, _ in [*_SUBMITS, *_CANCELS]]
        for module, name in methods:
            owner, method = name.split(".")
            unwrap(getattr(sys.modules[module], owner), method)


def setup(service_name: str) -> Any:
    """The SDK set up from the standard ``OTEL_*`` variables, then the instrumentor: the
    resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``; ``service_name`` where
    neither names the service), the exporter (``OTEL_TRACES_EXPORTER``: ``otlp``, the
    default, over HTTP/protobuf to ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``; ``console``;
    ``none``), a batch span processor (``OTEL_BSP_*``), the sampler (``OTEL_TRACES_SAMPLER``);
    a span per subtask with ``QUEUEWORKS_OTEL_SUBTASK_SPANS=1``.
    The tracer provider; its spans are flushed when the process exits."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = TracerProvider(resource=resource)
    names = os.environ.get("OTEL_TRACES_EXPORTER", "otlp")
    for name in (n.strip() for n in names.split(",")):
        exporter: SpanExporter
        if name in ("", "none"):
            continue
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporter = ConsoleSpanExporter()
        else:
            raise ValueError(f"OTEL_TRACES_EXPORTER: {name!r} is not otlp, console or none")
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    each = os.environ.get(SUBTASK_SPANS, "") not in ("", "0")
    QueueworksInstrumentor().instrument(tracer_provider=provider, subtask_spans=each)
    return provider
