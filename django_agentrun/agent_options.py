"""An Agent's options as the Messages API takes them: each option's values, what a run
may set for itself (RUN_OPTIONS), and the request params they become (thinking "off" as
the model takes it, system blocks, a structured-output schema, strict tools)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import anthropic
import pydantic

from . import catalog
from .exceptions import ConfigurationError, InvalidOption

# Request options, as the installed SDK's MessageCreateParams (and its ThinkingConfig*,
# OutputConfig and ToolChoice* params) spell them.
THINKING = ("adaptive", "between_tools", "off")
THINKING_DISPLAY = ("summarized", "omitted")
EFFORT = ("low", "medium", "high", "xhigh", "max")
SERVICE_TIER = ("auto", "standard_only")
TOOL_CHOICE = ("auto", "none", "any", "tool")
# What a run may set for itself (start_run(options=...), POST /runs/ "options").
RUN_OPTIONS = (
    "thinking",
    "thinking_display",
    "effort",
    "service_tier",
    "stop_sequences",
    "parallel_tool_use",
    "continue_on_max_tokens",
)


def _one_of(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value is not None and value not in allowed:
        raise InvalidOption(f"{name} must be one of {', '.join(allowed)}; got {value!r}.")


def off_thinking(model: str | None) -> str:
    """What thinking="off" sends on `model` (ModelInfo.thinking_off): where thinking cannot
    be off, "disabled", which the model's refusal names with the alternative."""
    info = catalog.model_info(model) if model else None
    return (info.thinking_off if info is not None else None) or "disabled"


def request_options(
    options: Mapping[str, Any], *, tool_names: list[str], model: str | None = None
) -> dict[str, Any]:
    """The Messages API params for the options an agent (or a run) sets: thinking,
    output_config.effort, tool_choice, stop_sequences, service_tier; left out when unset.
    InvalidOption naming the option for a bad value; thinking="off" as `model` takes it."""
    params: dict[str, Any] = {}
    thinking, display = options.get("thinking"), options.get("thinking_display")
    _one_of("thinking", thinking, THINKING)
    _one_of("thinking_display", display, THINKING_DISPLAY)
    if display is not None and thinking != "adaptive":
        raise InvalidOption('thinking_display needs thinking="adaptive".')
    if thinking == "adaptive":
        params["thinking"] = {"type": "adaptive", **({"display": display} if display else {})}
    elif thinking is not None:  # between_tools; "off" as the model takes it
        params["thinking"] = {"type": off_thinking(model) if thinking == "off" else thinking}
    effort = options.get("effort")
    _one_of("effort", effort, EFFORT)
    if effort is not None:
        params["output_config"] = {"effort": effort}
    choice = options.get("tool_choice")
    if isinstance(choice, str):
        choice = {"type": choice}
    if choice is not None:
        if not isinstance(choice, Mapping) or choice.get("type") not in TOOL_CHOICE:
            raise InvalidOption(f"tool_choice must be one of {', '.join(TOOL_CHOICE)}.")
        choice = dict(choice)
        if choice["type"] == "tool" and choice.get("name") not in tool_names:
            raise InvalidOption(f"tool_choice names no tool of the agent: {choice.get('name')!r}.")
        if choice["type"] in ("auto", "none", "any") and set(choice) - {
            "type",
            "disable_parallel_tool_use",
        }:
            raise InvalidOption(f"tool_choice {choice['type']!r} takes no other keys.")
    parallel = options.get("parallel_tool_use")
    if parallel is not None:
        if not isinstance(parallel, bool):
            raise InvalidOption("parallel_tool_use must be true or false.")
        if choice is None:
            choice = {"type": "auto"}
        if choice["type"] == "none":
            raise InvalidOption('parallel_tool_use does not apply to tool_choice "none".')
        if not parallel:
            choice["disable_parallel_tool_use"] = True
    if choice is not None:
        params["tool_choice"] = choice
    stops = options.get("stop_sequences") or ()
    if isinstance(stops, str) or not all(isinstance(x, str) and x.strip() for x in stops):
        raise InvalidOption("stop_sequences must be a list of non-blank strings.")
    if stops:
        params["stop_sequences"] = list(stops)
    tier = options.get("service_tier")
    _one_of("service_tier", tier, SERVICE_TIER)
    if tier is not None:
        params["service_tier"] = tier
    return params


def system_blocks(system: Any, where: str) -> str | list[dict[str, Any]]:
    """A system prompt: text, or text blocks (`{"type": "text", "text": ...}`, optionally
    `cache_control`) as the Messages API takes them."""
    if isinstance(system, str):
        return system
    if not isinstance(system, list | tuple):
        raise ConfigurationError(f"{where}: system must be text or a list of text blocks")
    blocks = []
    for i, block in enumerate(system):
        if (
            not isinstance(block, Mapping)
            or block.get("type") != "text"
            or not isinstance(block.get("text"), str)
            or not block["text"].strip()
            or set(block) - {"type", "text", "cache_control"}
        ):
            raise ConfigurationError(
                f'{where}: system[{i}] must be a text block {{"type": "text", "text": "..."}} '
                "with non-blank text"
            )
        blocks.append(dict(block))
    return blocks


def output_schema(output_format: Any, where: str) -> dict[str, Any] | None:
    """The JSON schema of `output_config.format`: from a pydantic model (made strict the
    way the SDK does it) or a JSON schema given as is, which must be strict already."""
    if output_format is None:
        return None
    if inspect.isclass(output_format) and issubclass(output_format, pydantic.BaseModel):
        schema = anthropic.transform_schema(output_format)
    elif isinstance(output_format, Mapping):
        schema = dict(output_format)
    else:
        raise ConfigurationError(
            f"{where}: output_format must be a pydantic model class or a JSON schema (a dict)"
        )
    problem = schema_problem(schema)
    if problem:
        raise ConfigurationError(f"{where}: output_format: {problem}")
    return schema


def schema_problem(schema: Any, path: str = "schema") -> str | None:
    """What structured outputs refuse in a JSON schema: the root must be an object, and
    every object must set additionalProperties to false. None when well-formed."""
    if not isinstance(schema, Mapping):
        return f"{path} must be a JSON object"
    if path == "schema" and schema.get("type") != "object":
        return 'the root of the schema must be {"type": "object", ...}'
    if schema.get("type") == "object" and schema.get("additionalProperties") is not False:
        return f"{path}: an object schema must set additionalProperties to false"
    for key in ("properties", "$defs", "definitions"):
        for name, sub in (schema.get(key) or {}).items():
            problem = schema_problem(sub, f"{path}.{key}.{name}")
            if problem:
                return problem
    for key in ("anyOf", "allOf", "oneOf", "prefixItems"):
        for k, sub in enumerate(schema.get(key) or ()):
            problem = schema_problem(sub, f"{path}.{key}.{k}")
            if problem:
                return problem
    if isinstance(schema.get("items"), Mapping):
        return schema_problem(schema["items"], f"{path}.items")
    return None


def strict_tool(definition: dict[str, Any]) -> dict[str, Any]:
    """A tool definition with `strict: true` and its input schema made strict."""
    return {
        **definition,
        "input_schema": anthropic.transform_schema(definition["input_schema"]),
        "strict": True,
    }
