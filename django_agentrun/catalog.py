"""TEMPORARY: the minimal part of the "models" branch's catalog interface this branch
uses (refusals, shipped_info); replaced by that branch's catalog.py at merge."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelInfo:
    id: str
    thinking: frozenset[str]
    thinking_display: frozenset[str]
    effort: frozenset[str]
    forced_tool_choice: bool
    structured_output: bool


_CURRENT = dict(
    thinking=frozenset({"adaptive", "disabled"}),
    thinking_display=frozenset({"summarized", "omitted"}),
    effort=frozenset({"low", "medium", "high", "xhigh", "max"}),
    forced_tool_choice=False,
    structured_output=True,
)
_LEGACY = dict(
    thinking=frozenset({"enabled", "disabled"}),
    thinking_display=frozenset(),
    effort=frozenset(),
    forced_tool_choice=True,
    structured_output=False,
)
SHIPPED: Mapping[str, ModelInfo] = {
    "claude-opus-5-5": ModelInfo("claude-opus-5-5", **_CURRENT),
    "claude-sonnet-5-5": ModelInfo("claude-sonnet-5-5", **_CURRENT),
    "claude-sonnet-4-5": ModelInfo("claude-sonnet-4-5", **_LEGACY),
}


def shipped_info(model: str) -> ModelInfo | None:
    return SHIPPED.get(model)


def model_info(model: str) -> ModelInfo | None:
    return SHIPPED.get(model)


def refusals(model: str, params: Mapping[str, Any], *, shipped_only: bool = False) -> list[str]:
    info = shipped_info(model) if shipped_only else model_info(model)
    if info is None:
        return []
    out = []
    thinking = params.get("thinking") or {}
    if thinking and thinking.get("type") not in info.thinking:
        out.append(f"{model} does not accept thinking.type {thinking.get('type')}")
    if thinking.get("display") and thinking["display"] not in info.thinking_display:
        out.append(f"{model} does not accept thinking.display {thinking['display']}")
    config = params.get("output_config") or {}
    if config.get("effort") and config["effort"] not in info.effort:
        out.append(f"{model} does not accept output_config.effort {config['effort']}")
    if config.get("format") and not info.structured_output:
        out.append(f"{model} does not accept output_config.format")
    choice = params.get("tool_choice") or {}
    if choice.get("type") in ("any", "tool") and not info.forced_tool_choice:
        out.append(f"{model} does not accept tool_choice {choice['type']}")
    return out
