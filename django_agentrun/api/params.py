"""Query parameters, read strictly: a value the API cannot use is a 400 field error
named after the parameter, never a 500 and never silently replaced."""

from __future__ import annotations

from rest_framework.exceptions import ValidationError
from rest_framework.request import Request

from .parsers import text_problem

# int() refuses very long digit strings; every limit here is far below this many digits.
_MAX_DIGITS = 18


def int_param(
    request: Request, name: str, default: int, *, minimum: int, maximum: int | None = None
) -> int:
    """An integer in plain ASCII digits, `default` when absent or empty."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    value = None
    if raw.isascii() and raw.isdigit():
        value = int(raw) if len(raw) <= _MAX_DIGITS else 10**_MAX_DIGITS
    if value is None or value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise ValidationError({name: [f"Must be an integer {bounds}."]})
    return value


def text_param(request: Request, name: str) -> str | None:
    """A text parameter the database can compare (no NUL, no unpaired surrogate)."""
    raw = request.query_params.get(name)
    if raw is not None and (problem := text_problem(raw)):
        raise ValidationError({name: [problem]})
    return raw
