"""The `chat` span of a model request: the `anthropic` SDK's own (one per request, the
child of the stretch's `invoke_agent` span), to which the app adds what the SDK's lacks
rather than making a second one (telemetry.py has the app's own spans and metrics)."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from .. import telemetry

__all__ = ["SDK_CHAT_SPAN", "Chat", "ChatTracerProvider"]

# The name the SDK gives the span of a Messages API call (`gen_ai.operation.name` `chat`).
SDK_CHAT_SPAN = "anthropic.messages.create"


class Chat:
    """One model request, around the SDK's call (`with Chat() as chat`): the SDK's `chat`
    span of it, made through `ChatTracerProvider` (None without an SDK, or until the SDK
    starts it). The app makes no span of its own: it adds to the SDK's what the SDK's
    lacks, the turn and the attempt as it starts, the answer's finish reason, cache writes
    and cache-read share when the stream's `message_delta` arrives (`answered`), while the
    span is still open (the SDK ends it when the stream's body ends)."""

    __slots__ = ("span", "token")

    def __enter__(self) -> Chat:
        self.span: Any = None
        self.token = _CHAT.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _CHAT.reset(self.token)

    def answered(self, message: Any) -> None:
        """The answer as the stream has it at its `message_delta` (the SDK's snapshot): its
        stop reason as the conventions' `gen_ai.response.finish_reasons`, its cache writes
        under the conventions' name (the SDK names them `cache_write`), the share of the
        prompt read from the cache. The SDK's span has the rest of the usage already."""
        span = self.span
        if span is None:
            return
        usage = message.usage
        read = usage.cache_read_input_tokens or 0
        written = usage.cache_creation_input_tokens or 0
        prompt = (usage.input_tokens or 0) + read + written
        attributes: dict[str, Any] = {
            "gen_ai.usage.cache_creation.input_tokens": written,
            "agentrun.cache_read.share": round(read / prompt, 4) if prompt else 0.0,
        }
        if message.stop_reason:
            attributes["gen_ai.response.finish_reasons"] = (message.stop_reason,)
        span.set_attributes(attributes)


# The model request the current context makes (None elsewhere).
_CHAT: ContextVar[Chat | None] = ContextVar("agentrun_chat", default=None)


class ChatTracerProvider(trace.TracerProvider):
    """The tracer provider the app gives the `anthropic` SDK's client (its `open_telemetry`
    option): the tracers of `provider` (None: the global one, whichever the host sets,
    later too), except that the `chat` span of a request made within `Chat` starts with
    the turn and the attempt (so a sampler sees them) and is handed to that `Chat`."""

    def __init__(self, provider: trace.TracerProvider | None = None) -> None:
        self.provider = provider

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Any = None,
    ) -> trace.Tracer:
        tracer = trace.get_tracer(
            instrumenting_module_name,
            instrumenting_library_version,
            self.provider,
            schema_url,
            attributes,
        )
        return _ChatTracer(tracer)


class _ChatTracer(trace.Tracer):
    """A tracer of the SDK's, with the `chat` span's start seen (`ChatTracerProvider`)."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    def start_span(  # type: ignore[override] - the API's signature, its defaults
        self,
        name: str,
        context: Any = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        chat = _CHAT.get() if name == SDK_CHAT_SPAN else None
        if chat is None or chat.span is not None:  # not the request's (first) chat span
            return self.tracer.start_span(name, context, kind, attributes, *args, **kwargs)
        asking = telemetry.asking()
        if asking is not None:
            attributes = {
                **(attributes or {}),
                "agentrun.turn.index": asking[0],
                "agentrun.model.attempt": asking[1],
            }
        span = self.tracer.start_span(name, context, kind, attributes, *args, **kwargs)
        if span.is_recording():
            chat.span = span
        return span

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return self.tracer.start_as_current_span(*args, **kwargs)
