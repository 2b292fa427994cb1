"""ModelClient over the official `anthropic` SDK (streaming, abortable, cache-aware)."""

from __future__ import annotations

import email.utils
import functools
import socket
import threading
import time
import typing
from typing import Any

import anthropic
import httpx2
from anthropic.types import TextBlockParam, TextCitationParam, ToolUseBlockParam

from .. import telemetry
from ..abort import AbortSignal
from ..conf import agentrun_settings
from ..servertools import MCPConnector
from . import caching
from . import governor as _governor
from .base import (
    ModelError,
    ModelRequest,
    ModelResponse,
    RateLimited,
    StreamAborted,
    Usage,
    emit,
)
from .tracing import Chat, ChatTracerProvider

__all__ = ["AnthropicModelClient"]


# Status to assume for an `event: error` sent mid-stream (the HTTP status there is 200).
_STREAM_ERROR_STATUS = {
    "overloaded_error": 529,
    "api_error": 500,
    "rate_limit_error": 429,
    "timeout_error": 504,
    "invalid_request_error": 400,
}


class _StreamHandle:
    """Lets the abort callback (another thread) cut the stream the worker is reading."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._response: httpx2.Response | None = None

    def attach(self, response: httpx2.Response) -> None:
        with self._lock:
            self._response = response

    def detach(self) -> None:
        """Called before the connection goes back to the pool: later cuts do nothing."""
        with self._lock:
            self._response = None

    def cut(self) -> None:
        # Under the lock, so detach() cannot return (and the pooled connection be reused
        # by another thread) while this is still cutting it.
        with self._lock:
            response = self._response
            if response is None:
                return  # not connected yet (the reader checks `abort` once it is) or done
            # Shutting the socket down wakes the reader blocked in recv() at once (a bare
            # close() from another thread would not, on Linux); the reader then closes the
            # response itself, so the connection pool is only touched from one thread.
            network_stream = response.extensions.get("network_stream")
            sock = network_stream.get_extra_info("socket") if network_stream is not None else None
            if isinstance(sock, socket.socket):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                    return
                except OSError:
                    pass  # already closed or not connected: fall back to closing the response
            response.close()


NO_API_KEY = "No Anthropic API key: set ANTHROPIC_API_KEY in the worker's environment."


class AnthropicModelClient:
    """Streams Messages API calls with the `anthropic` SDK.

    The SDK client is built lazily (on first use, once per instance) from the
    AGENTRUN_ANTHROPIC_* settings and the SDK's own environment variables
    (ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL, ...); constructor arguments override
    both. One instance can be shared by the threads of a worker process.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,
    ) -> None:
        self._api_key = api_key
        self._base_url = base_url
        self._max_retries = max_retries
        self._timeout = timeout
        self._client: anthropic.Anthropic | None = None
        self._lock = threading.Lock()
        # The headers of the last response this thread read (`anthropic-ratelimit-*`).
        self._local = threading.local()

    def __repr__(self) -> str:  # never show the key
        return f"<AnthropicModelClient base_url={self._base_url!r}>"

    @property
    def client(self) -> anthropic.Anthropic:
        """The SDK client, built on first access."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._build_client()
        return self._client

    def _build_client(self) -> anthropic.Anthropic:
        kwargs: dict[str, Any] = {
            "max_retries": (
                self._max_retries
                if self._max_retries is not None
                else agentrun_settings.ANTHROPIC_MAX_RETRIES
            ),
            "timeout": self._timeout
            if self._timeout is not None
            else agentrun_settings.ANTHROPIC_TIMEOUT,
        }
        # Only pass what was given, so the SDK's environment lookups still apply.
        if self._api_key is not None:
            kwargs["api_key"] = self._api_key
        if self._base_url is not None:
            kwargs["base_url"] = self._base_url
        client = anthropic.Anthropic(**kwargs)
        # As the SDK resolved them (its environment variables included), with the tracer
        # provider that hands each request's `chat` span to the app (tracing.Chat).
        options = client.open_telemetry
        traces = options["traces"]
        if telemetry.capture_content():
            # The host opted in to content in spans: the SDK's `chat` span has it too.
            traces = {**traces, "content_mode": "content"}
        provider = ChatTracerProvider(options.get("tracer_provider"))
        return client.with_options(
            open_telemetry={**options, "traces": traces, "tracer_provider": provider}
        )

    @property
    def last_headers(self) -> Any:
        """The HTTP headers of the last response (or refusal) this thread read: where the
        account stands (`anthropic-ratelimit-*`, `retry-after`), as the API said it."""
        return getattr(self._local, "headers", None)

    def _scope(self) -> str:
        """Whose limits these are (a hash of the key and the URL it is sent to)."""
        client = self.client
        return _governor.scope_of(client.api_key, str(client.base_url))

    def close(self) -> None:
        """Close the SDK client's connection pool (a later call builds a new one)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def list_models(self) -> list[dict[str, Any]]:
        """Every model the Models API lists for this key (GET /v1/models, all pages), as the
        SDK's ModelInfo in JSON form (capabilities included)."""
        return [info.model_dump(mode="json") for info in self.client.models.list(limit=1000)]

    # -- the ModelClient protocol ------------------------------------------------------------

    def create(self, request: ModelRequest, *, abort: AbortSignal) -> ModelResponse:
        """Stream one response; raise StreamAborted once `abort` fires, ModelError on failure."""
        if abort.aborted:
            raise StreamAborted(f"model call aborted before it started: {abort.reason}")
        params = self.build_params(request)
        governor = _governor.get_governor()
        if governor is not None:
            scope = self._scope()
            spent = _governor.estimate_input_tokens(params, request.admission)
            verdict = governor.admit(scope, request.model, request.admission, spent)
            if not verdict.go:
                raise RateLimited(
                    "Not now: the account's rate limit is spent (the governor).",
                    retryable=True,
                    retry_after=verdict.wait,
                )
            if verdict.wait and (abort.wait(verdict.wait) or abort.before_effect()):
                # The pacing, bounded (and the lease looked at again after it).
                raise StreamAborted(f"model call aborted before it started: {abort.reason}")
        self._local.headers = None
        handle = _StreamHandle()
        remove = abort.add_callback(handle.cut)
        stream = None
        messages = self.client.messages
        if "context_management" in params or "mcp_servers" in params:
            messages = self.client.beta.messages  # betas in SDK 2.16
        try:
            with Chat() as chat, messages.stream(**params) as stream:
                handle.attach(stream.response)
                self._local.headers = stream.response.headers
                try:
                    message = self._read(stream, abort, request.on_event, chat)
                    request_id = stream.request_id or getattr(message, "_request_id", None) or ""
                finally:
                    handle.detach()
        except StreamAborted:
            raise
        except Exception as exc:
            if abort.aborted:
                # Cutting the connection makes the reader fail; that is the abort, not an error.
                raise StreamAborted(f"model stream aborted: {abort.reason}") from exc
            error = self._model_error(exc, stream)
            if error is exc:
                raise
            if isinstance(error, RateLimited) and governor is not None:
                headers = getattr(getattr(exc, "response", None), "headers", None) or {}
                self._local.headers = headers
                governor.learn(scope, request.model, headers, retry_after=error.retry_after)
            raise error from exc
        finally:
            remove()
        if governor is not None and self._local.headers is not None:
            output = getattr(message.usage, "output_tokens", 0) or 0
            governor.learn(scope, request.model, self._local.headers, output_tokens=output)
        return ModelResponse(
            message_id=message.id,
            content=[_block_to_param(block) for block in message.content],
            stop_reason=message.stop_reason,
            stop_sequence=message.stop_sequence,
            model=message.model or request.model,
            usage=Usage.from_mapping(message.usage),
            request_id=request_id,
            stop_details=_stop_details(message),
            thinking_tokens=_thinking_tokens(message.usage),
        )

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _read(
        stream: Any, abort: AbortSignal, on_event: Any = None, chat: Chat | None = None
    ) -> Any:
        """Consume the stream (checking `abort` between events, handing each delta to
        `on_event`, the answer to the request's `chat` span at its `message_delta`); the
        final Message."""
        if abort.aborted:  # fired while we waited for the response headers
            raise StreamAborted(f"model stream aborted: {abort.reason}")
        answered = chat.answered if chat is not None and chat.span is not None else None
        for event in stream:
            if abort.aborted:
                break
            if answered is not None and event.type == "message_delta":
                answered(stream.current_message_snapshot)
            if on_event is not None:
                delta = _delta(event)
                if delta is not None:
                    emit(on_event, delta)
        if abort.aborted:
            # Even a stream that happened to finish is dropped: the run was cancelled or
            # this worker lost its lease, so nothing may be recorded from it.
            raise StreamAborted(f"model stream aborted: {abort.reason}")
        message = stream.get_final_message()
        if message.stop_reason is None:
            # The body ended cleanly before message_delta/message_stop (a proxy or gateway
            # closed it): the SDK returns the partial snapshot. Its text is truncated and a
            # tool_use may hold partial arguments that happen to validate: never use it.
            raise ModelError(
                "The model's stream ended before the message was complete (no stop reason).",
                retryable=True,
                request_id=stream.request_id or "",
            )
        return message

    @staticmethod
    def build_params(request: ModelRequest) -> dict[str, Any]:
        """The SDK keyword arguments for `request`, empty parts left out.

        With `cache_prefix` the cache follows the conversation (`caching.place`). Blocks
        are copied: the request is never mutated.
        """
        system = request.system
        if isinstance(system, str):  # tolerate a bare string system prompt
            system = [{"type": "text", "text": system}] if system else []
        system = [dict(block) for block in system]
        tools = [dict(tool) for tool in request.tools]
        params: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens,
            "messages": request.messages,
        }
        if request.cache_prefix:
            caching.place(params, tools, system, request.messages, request.cache_ttl)
        if request.context_management:
            params["context_management"] = {"edits": request.context_management["edits"]}
            params["betas"] = [request.context_management["beta"]]
        optional = {
            "system": system,
            "tools": tools,
            "tool_choice": request.tool_choice,
            "stop_sequences": list(request.stop_sequences),
            "metadata": dict(request.metadata),
        }
        params.update({key: value for key, value in optional.items() if value})
        for key, value in request.options.items():
            params.setdefault(key, value)  # what the engine set for this request wins
        if params.get("mcp_servers"):
            # The MCP connector is a beta (servertools.MCPConnector cites the docs).
            params["betas"] = [*params.get("betas", ()), MCPConnector.beta]
        return params

    def _model_error(self, exc: Exception, stream: Any) -> Exception:
        """Translate an SDK / transport failure into ModelError (retryable or not)."""
        if isinstance(exc, anthropic.APIStatusError):
            status = exc.status_code
            error_type = exc.type or ""
            if status == 200:  # an `event: error` inside a 200 stream
                status = _STREAM_ERROR_STATUS.get(error_type, 500)
            headers = exc.response.headers
            detail = exc.api_message or exc.message
            should_retry = headers.get("x-should-retry")
            if should_retry in ("true", "false"):
                # The API's explicit word wins (the SDK obeys it too: _base_client._should_retry).
                retryable = should_retry == "true"
            else:
                retryable = status in (408, 429) or status >= 500
            if usage_limit(status, exc.error_code, detail):
                retryable = False  # "Retrying ... fails until access resumes" (usage_limit)
            message = f"{status} {error_type or 'error'}: {detail}"
            # Only a limit that lifts is a rate limit the run waits out (parked); a 429 the
            # API says not to retry (the spend cap) fails the turn like any final error.
            kind = RateLimited if retryable and status in (429, 529) else ModelError
            return kind(
                self._redact(message),
                retryable=retryable,
                status=status,
                retry_after=wait_of(headers) if retryable else None,
                request_id=exc.request_id or "",
            )
        if isinstance(exc, anthropic.APITimeoutError | httpx2.TimeoutException):
            return ModelError(
                self._redact(f"model request timed out: {exc}"),
                retryable=True,
                request_id=_stream_request_id(stream),
            )
        if isinstance(exc, anthropic.APIConnectionError | httpx2.TransportError):
            # Refused, reset, or dropped mid-stream: the next attempt may well work.
            cause = exc.__cause__ or exc
            return ModelError(
                self._redact(f"model connection error: {type(cause).__name__}: {cause}"),
                retryable=True,
                request_id=_stream_request_id(stream),
            )
        if isinstance(exc, ValueError) and "Unable to parse tool parameter JSON" in str(exc):
            # Malformed tool input from the model; the SDK itself advises retrying.
            return ModelError(
                self._redact(str(exc)), retryable=True, request_id=_stream_request_id(stream)
            )
        if isinstance(exc, anthropic.AnthropicError):
            return ModelError(self._redact(f"{type(exc).__name__}: {exc}"), retryable=False)
        if isinstance(exc, TypeError) and "authentication method" in str(exc):
            return ModelError(NO_API_KEY, retryable=False)  # the SDK found no credentials
        return exc  # a bug, not a model failure: let it surface as itself

    def _redact(self, message: str) -> str:
        key = self._api_key or (self._client.api_key if self._client is not None else None)
        if key and key in message:
            message = message.replace(key, "[redacted]")
        return message


def _stop_details(message: Any) -> dict[str, Any] | None:
    details = getattr(message, "stop_details", None)
    return details.model_dump(mode="json") if details is not None else None


def _thinking_tokens(usage: Any) -> int:
    details = getattr(usage, "output_tokens_details", None)
    return int(getattr(details, "thinking_tokens", 0) or 0)


def _delta(event: Any) -> dict[str, Any] | None:
    """The SDK's raw stream event as a delta (`clients.base.DELTA_KINDS`), or None."""
    kind = getattr(event, "type", None)
    if kind == "content_block_delta":
        delta, index = event.delta, event.index
        if delta.type == "text_delta":
            return {"kind": "text", "index": index, "text": delta.text}
        if delta.type == "thinking_delta":
            return {"kind": "thinking", "index": index, "thinking": delta.thinking}
        if delta.type == "input_json_delta":
            if not delta.partial_json:
                return None  # the API opens every tool input with an empty one
            return {"kind": "input_json", "index": index, "partial_json": delta.partial_json}
        return None  # signatures, citations: in the complete response only
    if kind == "content_block_start":
        block = event.content_block
        start = {"kind": "block_start", "index": event.index, "block": block.type}
        if block.type in ("tool_use", "server_tool_use", "mcp_tool_use"):
            start.update(id=block.id, name=block.name)
        return start
    if kind == "content_block_stop":
        return {"kind": "block_stop", "index": event.index}
    return None


def _block_to_param(block: Any) -> dict[str, Any]:
    """A response content block as a plain dict that can be sent back to the API."""
    data = block.model_dump(mode="json")
    if data.get("type") == "tool_use":
        param = _as_param(data, ToolUseBlockParam)
        # The input may be partial after max_tokens; the API wants an object.
        param["input"] = data.get("input") if isinstance(data.get("input"), dict) else {}
        return param
    if data.get("type") == "text":
        param = _as_param(data, TextBlockParam)
        if param.get("citations"):
            param["citations"] = [
                _as_param(c, _CITATION_PARAMS[c["type"]])
                if c.get("type") in _CITATION_PARAMS
                else c
                for c in param["citations"]
            ]
        return param
    return block.model_dump(mode="json", exclude_none=True)


@functools.cache
def _param_keys(param_type: Any) -> tuple[frozenset[str], frozenset[str]]:
    """(every key, the required keys) of one of the SDK's TypedDict params. Read from the
    annotations: the SDK's postponed annotations hide Required from __required_keys__."""
    hints = typing.get_type_hints(param_type, include_extras=True)
    required = {k for k, v in hints.items() if typing.get_origin(v) is typing.Required}
    return frozenset(hints), frozenset(required)


def _as_param(data: dict[str, Any], param_type: Any) -> dict[str, Any]:
    """Every key the param type accepts; a None kept only where the param requires the key
    (e.g. a citation's document_title), dropped where the key is optional."""
    keys, required = _param_keys(param_type)
    return {k: v for k, v in data.items() if k in keys and (v is not None or k in required)}


_CITATION_PARAMS = {
    typing.get_args(typing.get_type_hints(t)["type"])[0]: t
    for t in typing.get_args(TextCitationParam)
}


def usage_limit(status: int, error_code: str | None, message: str | None) -> bool:
    """Whether an error says a spend limit was reached: the tier's monthly spend cap (429
    `rate_limit_error` with `error.details.error_code` `enforced_spend_limit_reached` and
    no retry-after) or a limit the organization or workspace set itself (400 whose message
    begins "You have reached your specified ... API usage limits"). "Retrying, including
    the SDKs' automatic retries, fails until access resumes" (Rate limits, "Reaching your
    spend cap" and "Setting your own spend limit",
    https://platform.claude.com/docs/en/api/rate-limits)."""
    if error_code == "enforced_spend_limit_reached":
        return True
    text = (message or "").lower()
    return (
        status in (400, 429)
        and text.startswith("you have reached your")
        and ("usage limit" in text)
    )


def wait_of(headers: Any) -> float | None:
    """How long a refused request waits before it is sent again: the `retry-after`
    ("The number of seconds to wait until you can retry the request. Earlier retries will
    fail."), else the time until the exhausted limit's `anthropic-ratelimit-*-reset`
    (Rate limits, "Response headers", https://platform.claude.com/docs/en/api/rate-limits);
    None when neither says."""
    found = _retry_after(headers)
    if found is not None:
        return found
    blocked = _governor.read_headers(headers)[1]
    return blocked if blocked > 0 else None


def _retry_after(headers: httpx2.Headers) -> float | None:
    """Seconds from retry-after-ms / retry-after (seconds or HTTP date), if present."""
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    parsed = email.utils.parsedate_tz(value)
    if parsed is None:
        return None
    return max(0.0, email.utils.mktime_tz(parsed) - time.time())


def _stream_request_id(stream: Any) -> str:
    try:
        return (stream.request_id or "") if stream is not None else ""
    except Exception:  # noqa: BLE001 - no response yet
        return ""
