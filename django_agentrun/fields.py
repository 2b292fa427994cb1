"""What the database can store, the same way on every supported database.

Postgres `jsonb` and `text` cannot hold U+0000, and `jsonb` refuses lone surrogates
(U+D800..U+DFFF, what `os.fsdecode` and `surrogateescape` make of undecodable bytes);
SQLite takes both. Tool output holds such characters whenever it is binary (a file,
`find -print0`, a subprocess), so the rule is:

- **JSON values** (run input and metadata, assistant content, tool arguments and results,
  event payloads) are stored faithfully on both databases: inside every string (keys
  included) such a character, and the escape character U+FDD0 itself, is written as
  U+FDD0 followed by its code point in four hex digits, and read back as the original
  character. U+FDD0 is a Unicode noncharacter, reserved for a program's internal use.
  Values JSON cannot represent (NaN, infinities) are refused on both databases alike.
- **Plain text columns** (names, ids, reasons, notes) never hold them: what a person or a
  caller gives is refused (`InvalidInput`, a 400 in the API); text the runtime writes from
  elsewhere (an exception message, a reconcile check's reason) has them replaced by U+FFFD.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from .exceptions import InvalidInput

ESCAPE = "\ufdd0"
# Characters a Postgres text or jsonb value cannot hold.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_TO_ESCAPE = re.compile(f"[\x00\ud800-\udfff{ESCAPE}]")
_ESCAPED = re.compile(f"{ESCAPE}([0-9a-f]{{4}})")
# How the characters to escape look in `json.dumps` output (ASCII, lowercase hex): a
# cheap test that spares the walk for nearly every value.
_IN_JSON_TEXT = re.compile(r"\\u(0000|d[89a-f][0-9a-f]{2}|fdd0)")


def _escape_str(value: str) -> str:
    return _TO_ESCAPE.sub(lambda m: f"{ESCAPE}{ord(m.group()):04x}", value)


def _unescape_str(value: str) -> str:
    return _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), value)


def _walk(value: Any, convert: Any) -> Any:
    if isinstance(value, str):
        return convert(value)
    if isinstance(value, dict):
        return {_walk(k, convert): _walk(v, convert) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_walk(v, convert) for v in value]
    return value


class StorableJSONEncoder(DjangoJSONEncoder):
    """Django's encoder (dates, decimals, UUIDs) with the escaping above; refuses NaN."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_nan"] = False
        super().__init__(*args, **kwargs)

    def encode(self, o: Any) -> str:
        text = super().encode(o)
        if _IN_JSON_TEXT.search(text) is None:
            return text
        return super().encode(_walk(o, _escape_str))


class StorableJSONDecoder(json.JSONDecoder):
    """Reads back what StorableJSONEncoder wrote (Postgres returns U+FDD0 as itself,
    SQLite as the `\\ufdd0` escape it was given)."""

    def decode(self, s: str, *args: Any, **kwargs: Any) -> Any:
        value = super().decode(s, *args, **kwargs)
        if ESCAPE in s or "\\ufdd0" in s:
            value = _walk(value, _unescape_str)
        return value


def check_json(value: Any, what: str) -> None:
    """InvalidInput unless `value` can be stored in a JSON column."""
    try:
        json.dumps(value, cls=StorableJSONEncoder)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} cannot be stored as JSON: {exc}") from None


def check_text(value: str | None, what: str) -> None:
    """InvalidInput if `value` holds a character a text column cannot store."""
    if value and _UNSTORABLE.search(value):
        raise InvalidInput(f"{what} must not contain NUL characters or lone surrogates.")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def unsendable(value: Any, path: str = "") -> str | None:
    """Where `value` holds an unpaired surrogate, which UTF-8 (so no request to the model)
    can carry; None when it holds none."""
    if isinstance(value, str):
        return path or "the value" if _LONE_SURROGATE.search(value) else None
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = unsendable(item, f"{path}[{key!r}]" if isinstance(key, str) else f"{path}[{key}]")
        if found:
            return found
    return None


def sendable(value: Any) -> Any:
    """`value` with each unpaired surrogate replaced by U+FFFD, as a UTF-8 decoder shows an
    undecodable byte: what is stored stays faithful, what the model reads can be sent."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value) if not value.isascii() else value
    return _walk(value, lambda text: _LONE_SURROGATE.sub("\ufffd", text))


def storable_text(value: str) -> str:
    """`value` with what a text column cannot store replaced by U+FFFD."""
    return _UNSTORABLE.sub("\ufffd", value) if value else value


def json_field(**kwargs: Any) -> Any:
    """A JSONField that stores values by the rule above."""
    from django.db import models

    return models.JSONField(encoder=StorableJSONEncoder, decoder=StorableJSONDecoder, **kwargs)
