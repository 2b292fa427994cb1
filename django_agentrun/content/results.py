"""Tool results: rich results (`ToolResult`) and block builders, how a result is
stored (`stored_result`) and how a stored one becomes tool_result content."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pydantic
from django.db import models

from ..exceptions import InvalidContent
from ..fields import sendable
from ..media import IMAGE_TYPES, image_type
from ..tools import canonical_json
from .blocks import has_cache_control, validate_blocks


class ResultFormat(models.TextChoices):
    """How a stored tool result renders as tool_result content."""

    JSON = "json", "JSON value"
    """Whatever a handler returned: a string is sent as is, anything else as canonical JSON text."""
    CONTENT = "content", "Content blocks"
    """A ToolResult's validated blocks, sent as they are."""


class ToolResult:
    """A rich tool result: content blocks the model sees as they are.

    ``ToolResult("Here is the chart:", image_block(png_bytes))``: each item is a block
    (text, image, document or search_result, as the Messages API spells them), a string
    (a text block) or a list of those. Validated when built (InvalidContent). Return it
    from a handler; anything else a handler returns is a JSON value.
    """

    __slots__ = ("blocks",)

    def __init__(self, *content: str | dict[str, Any] | Iterable[str | dict[str, Any]]) -> None:
        items: list[Any] = []
        for item in content:
            if isinstance(item, list | tuple):
                items.extend(item)
            else:
                items.append(item)
        if not items:
            raise InvalidContent("A ToolResult needs at least one content block.")
        blocks = [text_block(item) if isinstance(item, str) else item for item in items]
        clean = validate_blocks(blocks, where="content")
        for i, block in enumerate(clean):
            if has_cache_control(block):
                # Breakpoints would pile up turn after turn past the API's 4 per request.
                raise InvalidContent(
                    f"content[{i}]: cache_control is not allowed in tool results; the engine "
                    "places the prompt-caching breakpoints."
                )
        self.blocks: tuple[dict[str, Any], ...] = tuple(clean)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ToolResult) and other.blocks == self.blocks

    def __hash__(self) -> int:
        return hash(canonical_json(self.blocks))

    def __repr__(self) -> str:
        return f"ToolResult({', '.join(str(b.get('type')) for b in self.blocks)})"


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def image_block(data: bytes, media_type: str | None = None) -> dict[str, Any]:
    """An image block from the file's bytes (the media type is read from them if not given)."""
    media_type = media_type or image_type(data)
    if media_type not in IMAGE_TYPES:
        raise InvalidContent("The data is not a JPEG, PNG, GIF or WebP image.")
    encoded = base64.b64encode(data).decode("ascii")
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": media_type, "data": encoded},
    }


def pdf_block(data: bytes, *, title: str | None = None) -> dict[str, Any]:
    """A document block from a PDF file's bytes."""
    encoded = base64.b64encode(data).decode("ascii")
    block: dict[str, Any] = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": encoded},
    }
    if title is not None:
        block["title"] = title
    return block


@dataclass(frozen=True)
class StoredResult:
    """A tool result as ToolCall stores it: the JSON value and how it renders."""

    value: Any
    format: str = ResultFormat.JSON


def stored_result(value: Any) -> StoredResult:
    """What a handler, a reconcile check or a person gave, as it is stored: a ToolResult's
    blocks, or a JSON value (None becomes ""). InvalidContent if it is not JSON data."""
    if isinstance(value, StoredResult):
        return value
    if isinstance(value, ToolResult):
        return StoredResult(list(value.blocks), ResultFormat.CONTENT)
    if value is None:
        return StoredResult("")
    return StoredResult(json_value(value))


def json_value(value: Any) -> Any:
    """`value` as plain JSON data. Pydantic models and dataclasses become objects, other
    non-JSON types their str() (as canonical_json does); NaN and infinities are refused
    (no database stores them in JSON)."""
    if isinstance(value, str):
        return value
    try:
        return json.loads(json.dumps(value, ensure_ascii=False, allow_nan=False, default=_default))
    except (TypeError, ValueError) as exc:
        raise InvalidContent(f"The result is not a JSON value: {exc}.") from None


def _default(value: Any) -> Any:
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def render_result(value: Any, result_format: str | None = None) -> str | list[dict[str, Any]]:
    """A stored result as tool_result content. Results stored before formats existed
    (no format) render as JSON, so a legacy list of dicts becomes JSON text."""
    # Unpaired surrogates (undecodable bytes a tool returned) are kept in storage but cannot
    # travel as UTF-8: the model reads U+FFFD for them (fields.sendable).
    if result_format == ResultFormat.CONTENT and isinstance(value, list) and value:
        return sendable(value)
    if value is None:
        return ""
    if isinstance(value, str):
        return sendable(value)
    return sendable(canonical_json(value))
