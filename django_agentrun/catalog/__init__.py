"""The model table: what each Claude model accepts and what it costs.

The shipped table (SHIPPED, shipped_info) is plain data that imports without Django
settings: the Messages API stand-in reads it to refuse what each model refuses. The
functions that say so (model_info, refusals without shipped_only) also merge:

1. the capabilities `manage.py agentrun_models refresh` stored from the Models API (the
   JSON file named by AGENTRUN_MODELS_FILE), and
2. the host project's AGENTRUN_MODELS overrides (partial dicts merged over an entry),
   with the legacy AGENTRUN_PRICES folded in.

Sources: the platform docs' model overview pages and pricing page (platform.claude.com,
"Models & pricing", read 2026-12). A figure the docs did not give is marked UNSOURCED
beside it; override it with AGENTRUN_MODELS when you know better.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .overrides import CatalogError, catalog_errors, known_models, model_info
from .table import SHIPPED, shipped_info
from .vocabulary import (
    CODE_EXECUTION,
    EFFORT_LEVELS,
    SERVER_TOOL_PREFIXES,
    SERVER_TOOL_TYPES,
    THINKING_DISPLAYS,
    THINKING_TYPES,
    TOOL_SEARCH,
    WEB_FETCH,
    WEB_SEARCH,
    ModelInfo,
    Prices,
)

__all__ = [
    "CODE_EXECUTION",
    "EFFORT_LEVELS",
    "SERVER_TOOL_TYPES",
    "SHIPPED",
    "THINKING_DISPLAYS",
    "THINKING_TYPES",
    "TOOL_SEARCH",
    "WEB_FETCH",
    "WEB_SEARCH",
    "CatalogError",
    "ModelInfo",
    "Prices",
    "catalog_errors",
    "known_models",
    "model_info",
    "refusals",
    "shipped_info",
]


# ---- refusals ---------------------------------------------------------------------------


def _is_server_tool(tool_type: Any) -> bool:
    return isinstance(tool_type, str) and tool_type.startswith(SERVER_TOOL_PREFIXES)


def refusals(model: str, params: Mapping[str, Any], *, shipped_only: bool = False) -> list[str]:
    """One message per option in a Messages API request's `params` that `model` refuses.

    Unknown model: [] (manage.py check warns about the model itself).
    """
    info = shipped_info(model) if shipped_only else model_info(model)
    if info is None:
        return []
    out: list[str] = []
    name = model

    max_tokens = params.get("max_tokens")
    if (
        isinstance(max_tokens, int)
        and not isinstance(max_tokens, bool)
        and info.max_output
        and max_tokens > info.max_output
    ):
        out.append(f"{name} does not accept max_tokens {max_tokens} (at most {info.max_output})")

    thinking = params.get("thinking")
    if isinstance(thinking, Mapping):
        kind = thinking.get("type")
        if kind not in info.thinking:
            accepted = ", ".join(sorted(info.thinking)) or "none"
            out.append(f"{name} does not accept thinking.type {kind!r} (accepts: {accepted})")
        elif kind == "enabled" and not info.thinking_budget:
            out.append(f"{name} does not accept thinking.budget_tokens")
        display = thinking.get("display")
        if display is not None and display not in info.thinking_display:
            out.append(f"{name} does not accept thinking.display {display!r}")

    output_config = params.get("output_config")
    if isinstance(output_config, Mapping):
        effort = output_config.get("effort")
        if effort is not None and effort not in info.effort:
            if info.effort:
                accepted = ", ".join(e for e in EFFORT_LEVELS if e in info.effort)
                out.append(
                    f"{name} does not accept output_config.effort {effort!r} (accepts: {accepted})"
                )
            else:
                out.append(f"{name} does not accept output_config.effort")
        if output_config.get("format") is not None and not info.structured_output:
            out.append(f"{name} does not accept output_config.format")

    tool_choice = params.get("tool_choice")
    if isinstance(tool_choice, Mapping) and tool_choice.get("type") in ("any", "tool"):
        if not info.forced_tool_choice:
            out.append(f"{name} does not accept tool_choice {{'type': {tool_choice['type']!r}}}")

    if not info.sampling:
        for option in ("temperature", "top_p", "top_k"):
            value = params.get(option)
            if value is None or (option == "temperature" and value == 1):
                continue  # absent, or the default (1.0) the API accepts
            out.append(f"{name} does not accept {option}")

    tools = params.get("tools")
    if isinstance(tools, list | tuple):
        for tool in tools:
            if not isinstance(tool, Mapping):
                continue
            tool_type = tool.get("type")
            if _is_server_tool(tool_type) and tool_type not in info.server_tools:
                out.append(f"{name} does not accept the server tool {tool_type}")
    return out
