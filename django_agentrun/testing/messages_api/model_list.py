"""GET /v1/models and /v1/models/{model_id}: the Models API, answered from the shipped
model table (django_agentrun.catalog, importable without Django), in the shape of the
SDK's ModelInfo (anthropic 2.16 types/model_info.py, model_capabilities.py)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from django_agentrun.catalog import (
    CODE_EXECUTION,
    EFFORT_LEVELS,
    SHIPPED,
    WEB_SEARCH,
    ModelInfo,
    shipped_info,
)


class NotFound(LookupError):
    """No such model (the handler answers 404 not_found_error)."""


class Invalid(ValueError):
    """A bad query parameter (the handler answers 400 invalid_request_error)."""


# Release dates are not in the table: the API's epoch for "unknown".
_UNKNOWN_DATE = "1970-01-01T00:00:00Z"
_LINES = ("haiku", "sonnet", "opus", "fable", "mythos")


def _supported(flag: bool) -> dict[str, bool]:
    return {"supported": bool(flag)}


def model_object(info: ModelInfo) -> dict[str, Any]:
    """One model as the Models API describes it."""
    line = next((name for name in _LINES if f"-{name}-" in f"-{info.id}-"), None)
    thinking_types = {
        kind: _supported(kind in info.thinking)
        for kind in ("adaptive", "between_tools", "disabled", "enabled")
    }
    # "True on a model that does not support thinking" (ThinkingTypes.disabled).
    thinking_types["disabled"] = _supported("disabled" in info.thinking or not info.thinking)
    effort = {level: _supported(level in info.effort) for level in EFFORT_LEVELS}
    web_search = any(t in info.server_tools for t in WEB_SEARCH)
    code_execution = any(t in info.server_tools for t in CODE_EXECUTION)
    return {
        "type": "model",
        "id": info.id,
        "display_name": info.id.replace("claude-", "Claude ").replace("-", " ").title(),
        "created_at": _UNKNOWN_DATE,
        "lifecycle": "active",
        "deprecated_at": None,
        "retires_at": None,
        "line": line,
        "max_input_tokens": info.context_window,
        "max_tokens": info.max_output,
        "capabilities": {
            "batch": _supported(True),
            "citations": _supported(True),
            "code_execution": _supported(code_execution),
            "context_management": {"supported": True},
            "effort": {"supported": bool(info.effort), **effort},
            "image_input": _supported(True),
            "pdf_input": _supported(True),
            "server_tools": {
                "supported": web_search or code_execution,
                "web_search": _supported(web_search),
                "code_execution": _supported(code_execution),
            },
            "structured_outputs": _supported(info.structured_output),
            "thinking": {"supported": bool(info.thinking), "types": thinking_types},
        },
    }


def _listed() -> list[ModelInfo]:
    seen: dict[str, ModelInfo] = {}
    for info in SHIPPED.values():
        seen.setdefault(info.id, info)
    return list(seen.values())


def retrieve(model_id: str) -> dict[str, Any]:
    info = shipped_info(model_id)
    if info is None:
        raise NotFound(f"model: {model_id}")
    return model_object(info)


def page(query: str) -> dict[str, Any]:
    """One page of the list, with the API's after_id / before_id / limit."""
    params = {k: v[-1] for k, v in parse_qs(query).items()}
    try:
        limit = int(params.get("limit", 20))
    except ValueError:
        raise Invalid("limit: Input should be a valid integer") from None
    if not 1 <= limit <= 1000:
        raise Invalid("limit: Input should be between 1 and 1000")
    models = _listed()
    ids = [m.id for m in models]
    if "after_id" in params:
        if params["after_id"] not in ids:
            raise Invalid(f"after_id: unknown model {params['after_id']!r}")
        models = models[ids.index(params["after_id"]) + 1 :][:limit]
    elif "before_id" in params:
        if params["before_id"] not in ids:
            raise Invalid(f"before_id: unknown model {params['before_id']!r}")
        end = ids.index(params["before_id"])
        models = models[max(0, end - limit) : end]
    else:
        models = models[:limit]
    data = [model_object(m) for m in models]
    more = bool(data) and (
        data[-1]["id"] != ids[-1] if "before_id" not in params else data[0]["id"] != ids[0]
    )
    return {
        "data": data,
        "has_more": more,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }
