"""Structured outputs (`output_config.format`), as the real API checks them: the schema's
shape when a request carries one, and whether a scripted answer follows it (the real
model's output is constrained to the schema, so a script that breaks it is a broken
script, not a model answer). Standard library only: the subset of JSON Schema that
structured outputs accept (type, properties, required, additionalProperties, items,
enum, const, anyOf, $ref into $defs)."""

from __future__ import annotations

from typing import Any

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
