"""Request options as the real API checks them (thinking, output_config, service_tier, and
what the requested model refuses, from the shipped model table), and structured outputs
(`output_config.format`): the schema's shape, and whether a scripted answer follows it
(the real model's output is constrained to the schema, so a script that breaks it is a
broken script, not a model answer). Standard library only: the subset of JSON Schema
that structured outputs accept (type, properties, required, additionalProperties, items,
enum, const, anyOf, $ref into $defs)."""

from __future__ import annotations

from typing import Any

from ...catalog import refusals

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def schema_problem(schema: Any, path: str = "output_config.format.schema") -> str | None:
    """Why the API refuses `schema` for structured outputs, or None: the root is an
    object, and every object schema sets additionalProperties to false."""
    if not isinstance(schema, dict):
        return f"{path}: Input should be a valid dictionary"
    if path == "output_config.format.schema" and schema.get("type") != "object":
        return f"{path}: the root schema must have type 'object'"
    if schema.get("type") == "object" and schema.get("additionalProperties") is not False:
        return f"{path}: For 'object' type, 'additionalProperties' must be explicitly set to false"
    children: list[tuple[str, Any]] = []
    for key in ("properties", "$defs", "definitions"):
        children += [(f"{path}.{key}.{n}", s) for n, s in (schema.get(key) or {}).items()]
    for key in ("anyOf", "allOf", "prefixItems"):
        children += [(f"{path}.{key}.{k}", s) for k, s in enumerate(schema.get(key) or ())]
    if isinstance(schema.get("items"), dict):
        children.append((f"{path}.items", schema["items"]))
    for where, child in children:
        problem = schema_problem(child, where)
        if problem:
            return problem
    return None


def mismatch(value: Any, schema: dict[str, Any], root: dict[str, Any], path: str = "$") -> str:
    """Where `value` breaks `schema` ("" when it follows it)."""
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return mismatch(value, root.get("$defs", {}).get(ref.split("/")[-1], {}), root, path)
    if "anyOf" in schema:
        if all(mismatch(value, s, root, path) for s in schema["anyOf"]):
            return f"{path}: matches none of anyOf"
        return ""
    if "const" in schema and value != schema["const"]:
        return f"{path}: should be {schema['const']!r}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path}: should be one of {schema['enum']!r}"
    kinds = schema.get("type")
    if kinds is not None:
        kinds = kinds if isinstance(kinds, list) else [kinds]
        ok = any(
            isinstance(value, _TYPES.get(k, ()))
            and not (k in ("integer", "number") and isinstance(value, bool))
            for k in kinds
        )
        if not ok:
            return f"{path}: should be of type {'/'.join(kinds)}"
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for name in schema.get("required") or ():
            if name not in value:
                return f"{path}: missing required property {name!r}"
        for name, item in value.items():
            if name in properties:
                problem = mismatch(item, properties[name], root, f"{path}.{name}")
                if problem:
                    return problem
            elif schema.get("additionalProperties") is False:
                return f"{path}: unexpected property {name!r}"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for k, item in enumerate(value):
            problem = mismatch(item, schema["items"], root, f"{path}[{k}]")
            if problem:
                return problem
    return ""


_THINKING_TYPES = ("adaptive", "enabled", "disabled", "between_tools")
_DISPLAY = ("summarized", "omitted")
_EFFORT = ("low", "medium", "high", "xhigh", "max")
_SERVICE_TIERS = ("auto", "standard_only")
_INFERENCE_GEOS = ("global", "us")  # the data-residency page's values


def problem(body: dict[str, Any]) -> str | None:
    """What the API says of a request's thinking, output_config (effort, format) and
    service_tier: their shapes as the SDK's params declare them, then what the requested
    model refuses (the shipped model table). None when it accepts them."""
    config = body.get("thinking")
    if config is not None:
        if not isinstance(config, dict) or config.get("type") not in _THINKING_TYPES:
            return (
                "thinking: Input tag found using 'type' does not match any of the expected "
                "tags: 'adaptive', 'enabled', 'disabled', 'between_tools'"
            )
        kind = config["type"]
        if kind == "between_tools":
            # ThinkingConfigBetweenToolsParam (anthropic 2.16) has its type and nothing else.
            for key in config:
                if key != "type":
                    return f"thinking.between_tools.{key}: Extra inputs are not permitted"
        if config.get("display") is not None and (
            kind == "disabled" or config["display"] not in _DISPLAY
        ):
            return f"thinking.{kind}.display: Input should be 'summarized' or 'omitted'"
        if kind == "enabled":
            budget = config.get("budget_tokens")
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1024:
                return "thinking.enabled.budget_tokens: Input should be >= 1024"
            if budget >= body.get("max_tokens", 0):
                return "`max_tokens` must be greater than `thinking.budget_tokens`"
        choice = body.get("tool_choice")
        forced = isinstance(choice, dict) and choice.get("type") in ("any", "tool")
        if kind == "enabled" and forced:
            # Manual thinking only: "Adaptive thinking, including on models where thinking
            # is on by default, supports forced tool use" (catalog RULES
            # thinking_x_tool_choice, the thinking page).
            return "Thinking may not be enabled when tool_choice forces tool use."
    output = body.get("output_config")
    if output is not None:
        if not isinstance(output, dict):
            return "output_config: Input should be a valid dictionary"
        for key in output:
            if key not in ("effort", "format"):
                return f"output_config.{key}: Extra inputs are not permitted"
        if output.get("effort") is not None and output["effort"] not in _EFFORT:
            return "output_config.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'"
        fmt = output.get("format")
        if fmt is not None:
            if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
                return "output_config.format.type: Input should be 'json_schema'"
            if "schema" not in fmt:
                return "output_config.format.schema: Field required"
            found = schema_problem(fmt["schema"])
            if found:
                return found
    tier = body.get("service_tier")
    if tier is not None and tier not in _SERVICE_TIERS:
        return "service_tier: Input should be 'auto' or 'standard_only'"
    geo = body.get("inference_geo")
    if geo is not None and geo not in _INFERENCE_GEOS:
        return "inference_geo: Input should be 'global' or 'us'"
    refused = refusals(body["model"], body, shipped_only=True)
    return "; ".join(refused) if refused else None
