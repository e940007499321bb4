"""Handlers of the tracing tests (``tests/test_otel.py``): they run on real workers."""

from __future__ import annotations

from typing import Any

from queueworks import JobContext


def traced(payload: Any, ctx: JobContext) -> dict[str, Any]:
    """Logs through ``ctx.log`` and opens a span of its own (nested under the job's,
    if the worker traces); returns what it was given."""
    ctx.log.info("handler_said", x=payload["x"])
    from opentelemetry import trace

    with trace.get_tracer("tests.handlers_otel").start_as_current_span("inner"):
        pass
    return {"x": payload["x"]}


def plain(payload: Any, ctx: JobContext) -> int:
    """No OpenTelemetry here: for a worker that has none."""
    ctx.log.info("handler_said", x=payload)
    return int(payload) * 2


def fails(payload: Any) -> None:
    raise ValueError(f"bad input {payload!r}")


async def traced_async(payload: Any, ctx: JobContext) -> int:
    """As ``traced``, a coroutine: its span nests under the job's on the event loop."""
    import asyncio

    from opentelemetry import trace

    with trace.get_tracer("tests.handlers_otel").start_as_current_span("inner_async"):
        await asyncio.sleep(0.01)
    ctx.log.info("handler_said", x=payload)
    return int(payload) + 1


def waits(payload: Any, ctx: JobContext) -> str:
    """Runs ``payload`` seconds, at a safe point every 20 ms (stopped there if cancelled)."""
    import time

    end = time.monotonic() + float(payload)
    while time.monotonic() < end:
        ctx.checkpoint()
        time.sleep(0.02)
    return "finished"
