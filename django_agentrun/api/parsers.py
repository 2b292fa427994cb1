"""What the API accepts as input: JSON bodies and query parameters every supported
database can store, the same way on each (docs/explanation/durability.md).

Inside JSON values, NUL and unpaired surrogates are stored faithfully (the storage rule
of `django_agentrun.fields`); text columns refuse them (serializer fields and the
services answer 400), and so do query parameters here, since they filter text columns.
Non-finite numbers have no JSON form at all, and Python's JSON decoder gives up on deep
nesting with a RecursionError: both are a 400 here instead of a 500 later.
"""

from __future__ import annotations

import math
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

# Deeper than any content block, tool input or metadata needs; far below the
# recursion limits of Python's and Postgres's JSON parsers.
MAX_JSON_DEPTH = 64


def text_problem(text: str) -> str | None:
    """Why `text` cannot be stored, or None."""
    if "\x00" in text:
        return "NUL characters (\\u0000) are not allowed."
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "Unpaired surrogate characters (\\ud800-\\udfff) are not allowed."
    return None


def json_problem(value: Any) -> str | None:
    """Why a decoded JSON value cannot be stored, or None. Iterative: no recursion limit."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= MAX_JSON_DEPTH:
                return f"JSON nested deeper than {MAX_JSON_DEPTH} levels is not accepted."
            children = item.items() if isinstance(item, dict) else enumerate(item)
            for _key, child in children:
                stack.append((child, depth + 1))
        elif isinstance(item, float) and not math.isfinite(item):
            return "Numbers must be finite (1e400 is not)."
    return None


class StrictJSONParser(JSONParser):
    """DRF's JSON parser, refusing with a ParseError (400) what `json_problem` names."""

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError(
                f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels."
            ) from exc
        problem = json_problem(data)
        if problem is not None:
            raise ParseError(f"JSON parse error - {problem}")
        return data
