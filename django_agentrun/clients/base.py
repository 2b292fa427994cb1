"""The small protocol between the engine and a model (Claude Messages API shaped)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..abort import AbortSignal
from ..exceptions import AgentRunError

USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)


# The API's nested breakdowns of a response's usage that pricing needs (anthropic 2.16
# types/usage.py): cache writes by TTL, and server tool requests.
CACHE_CREATION_KEYS = ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")
SERVER_TOOL_USE_KEYS = ("web_search_requests", "web_fetch_requests")


def _get(data: Any, key: str) -> Any:
    return data.get(key) if isinstance(data, dict) else getattr(data, key, None)


def _geo(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _counts(data: Any, keys: tuple[str, ...]) -> tuple[tuple[str, int], ...] | None:
    """A nested usage object's counts, as sorted pairs (None: the response had none)."""
    if data is None:
        return None
    return tuple((key, int(_get(data, key) or 0)) for key in keys)


@dataclass(frozen=True)
class Usage:
    """Token counts of one response, named like the API's usage keys."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    # usage.cache_creation (writes by TTL) and usage.server_tool_use, as (key, count)
    # pairs; None when the response had none. Kept for pricing (engine/guards.cost_of).
    cache_creation: tuple[tuple[str, int], ...] | None = None
    server_tool_use: tuple[tuple[str, int], ...] | None = None
    # usage.inference_geo: where inference ran ("us" bills 1.1x; None: not said).
    inference_geo: str | None = None

    def __post_init__(self) -> None:
        # Accept the API's dict shape too (Usage(**response_usage), scripted replies).
        for name, keys in (
            ("cache_creation", CACHE_CREATION_KEYS),
            ("server_tool_use", SERVER_TOOL_USE_KEYS),
        ):
            value = getattr(self, name)
            if isinstance(value, dict):
                object.__setattr__(self, name, _counts(value, keys))

    @classmethod
    def from_mapping(cls, data: Any) -> Usage:
        def get(key: str) -> int:
            return int(_get(data, key) or 0)

        return cls(
            **{key: get(key) for key in USAGE_KEYS},
            cache_creation=_counts(_get(data, "cache_creation"), CACHE_CREATION_KEYS),
            server_tool_use=_counts(_get(data, "server_tool_use"), SERVER_TOOL_USE_KEYS),
            inference_geo=_geo(_get(data, "inference_geo")),
        )

    def as_dict(self) -> dict[str, int]:
        """The four counters the run and its turns keep."""
        return {key: getattr(self, key) for key in USAGE_KEYS}

    def as_billed(self) -> dict[str, Any]:
        """The usage as the API reported it, nested breakdowns included (what is priced)."""
        out: dict[str, Any] = self.as_dict()
        if self.cache_creation is not None:
            out["cache_creation"] = dict(self.cache_creation)
        if self.server_tool_use is not None:
            out["server_tool_use"] = dict(self.server_tool_use)
        if self.inference_geo is not None:
            out["inference_geo"] = self.inference_geo
        return out

    @property
    def prompt_tokens(self) -> int:
        """All tokens of the prompt, cached or not."""
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens


@dataclass(frozen=True)
class ModelRequest:
    """One Messages API request. `system` and `tools` are the stable (cacheable) prefix."""

    model: str
    messages: list[dict[str, Any]]
    max_tokens: int
    system: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: dict[str, Any] | None = None
    cache_prefix: bool = True
    # The TTL of the cache breakpoints ("5m" or "1h": a run that may wait for a person).
    cache_ttl: str = "5m"
    # The beta `context_management` ({"edits": [...], "beta": its beta name}) or None.
    context_management: dict[str, Any] | None = None
    stop_sequences: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    # Further request params, named as the SDK's MessageCreateParams names them (thinking,
    # output_config, service_tier, ...): the agent's options (agent_options.request_options).
    options: dict[str, Any] = field(default_factory=dict)
    # Where a streaming client hands each delta as it arrives (`DELTA_KINDS`); None: nowhere.
    # Not part of the request sent: a client that cannot stream ignores it.
    on_event: Callable[[dict[str, Any]], None] | None = field(
        default=None, compare=False, repr=False
    )
    # Who the request is for, as the rate-limit governor shares the account's limits out
    # (clients/governor.py): {"run": the Run} from the engine, or {"key": fair-share key,
    # "priority": 0 first, "ticket": an id}. Not sent; None: paced without a fair share.
    admission: dict[str, Any] | None = field(default=None, compare=False, repr=False)


# What a client hands `ModelRequest.on_event`, one dict per delta, as the model writes:
#   {"kind": "block_start", "index": i, "block": "text" | "thinking" | "redacted_thinking"
#                                                | "tool_use" | ..., "id": ..., "name": ...}
#   {"kind": "text", "index": i, "text": "..."}
#   {"kind": "thinking", "index": i, "thinking": "..."}   (as the API sends it: summarized,
#                                                          or empty when omitted)
#   {"kind": "input_json", "index": i, "partial_json": "..."}   (a tool_use's arguments)
#   {"kind": "block_stop", "index": i}
# `index` is the content block's position in the response. Deltas are a view of the answer
# being written, never its record: the complete response is.
DELTA_KINDS = ("block_start", "text", "thinking", "input_json", "block_stop")


def emit(on_event: Callable[[dict[str, Any]], None] | None, delta: dict[str, Any]) -> None:
    """Hand `delta` to `on_event`, if any; a sink that fails never fails the model call."""
    if on_event is None:
        return
    try:
        on_event(delta)
    except Exception:  # noqa: BLE001 - a view of the stream, never a reason to stop it
        pass


@dataclass(frozen=True)
class ModelResponse:
    """What the engine records of one model response."""

    message_id: str
    content: list[dict[str, Any]]
    stop_reason: str | None
    usage: Usage
    model: str = ""
    request_id: str = ""
    stop_sequence: str | None = None
    # The response's stop_details (a refusal's category and explanation), when it has them.
    stop_details: dict[str, Any] | None = None
    # usage.output_tokens_details.thinking_tokens: of the output tokens, the reasoning's.
    thinking_tokens: int = 0


class ModelError(AgentRunError):
    """The model call failed."""

    code = "model_error"

    def __init__(
        self,
        message: str = "",
        *,
        retryable: bool = False,
        status: int | None = None,
        retry_after: float | None = None,
        request_id: str = "",
    ) -> None:
        super().__init__(message or self.__doc__ or "")
        self.retryable = retryable
        self.status = status
        self.retry_after = retry_after
        self.request_id = request_id

    def __reduce__(self):  # keep keyword arguments through pickling (Celery pickles errors)
        return (
            _rebuild_model_error,
            (type(self), str(self), self.retryable, self.status, self.retry_after, self.request_id),
        )


def _rebuild_model_error(cls, message, retryable, status, retry_after, request_id):
    return cls(
        message, retryable=retryable, status=status, retry_after=retry_after, request_id=request_id
    )


class RateLimited(ModelError):
    """The account's rate limit (429), the API's overload (529), or the rate-limit
    governor's "not now": nothing was answered, so nothing is paid. The engine parks the
    run until `retry_after` seconds have passed, instead of waiting in the worker's slot."""

    code = "rate_limited"


class StreamAborted(AgentRunError):
    """The model stream was closed because the run was cancelled or lost its lease."""

    code = "stream_aborted"


@runtime_checkable
class ModelClient(Protocol):
    """Anything that turns a ModelRequest into a ModelResponse.

    It must raise StreamAborted promptly once `abort` fires (closing the HTTP
    response, not draining it), ModelError(retryable=True) for 429/529/5xx and
    connection errors, and ModelError(retryable=False) for the rest.
    """

    def create(self, request: ModelRequest, *, abort: AbortSignal) -> ModelResponse: ...
