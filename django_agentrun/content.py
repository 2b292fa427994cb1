"""Content blocks: rich tool results (`ToolResult`), a run's input, and how a stored tool
result becomes tool_result content.

The block models mirror the `anthropic` SDK's param types (TextBlockParam,
ImageBlockParam, DocumentBlockParam, SearchResultBlockParam: a test keeps them in
step) and refuse what the Messages API refuses: unknown block types and keys, missing
fields, blank text, bad base64, image data that is not the declared type. A block
that passes may still be refused by the API for what only it can check (a URL it
cannot download, an image too large): the run then fails with `history_rejected`,
and `services.replace_tool_result` repairs it.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import pydantic
from django.db import models

from .exceptions import InvalidContent
from .media import IMAGE_TYPES, decode_base64, image_type
from .tools import canonical_json


class ResultFormat(models.TextChoices):
    """How a stored tool result renders as tool_result content."""

    JSON = "json", "JSON value"
    """Whatever a handler returned: a string is sent as is, anything else as canonical JSON text."""
    CONTENT = "content", "Content blocks"
    """A ToolResult's validated blocks, sent as they are."""


# --------------------------------------------------------------------------- block models


class _Strict(pydantic.BaseModel):
    # The API refuses unknown keys; strict: no silent coercion of what a tool returned.
    model_config = pydantic.ConfigDict(extra="forbid", strict=True)


class CacheControl(_Strict):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] = "5m"


class CitationsConfig(_Strict):
    enabled: bool = False


class _CharLocation(_Strict):
    type: Literal["char_location"]
    cited_text: str
    document_index: int
    document_title: str | None
    start_char_index: int
    end_char_index: int


class _PageLocation(_Strict):
    type: Literal["page_location"]
    cited_text: str
    document_index: int
    document_title: str | None
    start_page_number: int
    end_page_number: int


class _ContentBlockLocation(_Strict):
    type: Literal["content_block_location"]
    cited_text: str
    document_index: int
    document_title: str | None
    start_block_index: int
    end_block_index: int


class _WebSearchResultLocation(_Strict):
    type: Literal["web_search_result_location"]
    cited_text: str
    encrypted_index: str
    title: str | None
    url: str


class _SearchResultLocation(_Strict):
    type: Literal["search_result_location"]
    cited_text: str
    search_result_index: int
    source: str
    title: str | None
    start_block_index: int
    end_block_index: int


Citation = Annotated[
    _CharLocation
    | _PageLocation
    | _ContentBlockLocation
    | _WebSearchResultLocation
    | _SearchResultLocation,
    pydantic.Field(discriminator="type"),
]


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[Citation] | None = None

    @pydantic.field_validator("text")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("text content blocks must contain non-whitespace text")
        return value


def _url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("must be an http(s) URL")
    return value


def _file_id(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


Url = Annotated[str, pydantic.AfterValidator(_url)]
FileId = Annotated[str, pydantic.AfterValidator(_file_id)]


class Base64ImageSource(_Strict):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str

    @pydantic.model_validator(mode="after")
    def _data_is_that_image(self) -> Base64ImageSource:
        raw = decode_base64(self.data)
        if raw is None:
            raise ValueError("data is not valid base64 (standard alphabet, no line breaks)")
        actual = image_type(raw)
        if actual is None:
            raise ValueError("data is not a JPEG, PNG, GIF or WebP image")
        if actual != self.media_type:
            raise ValueError(
                f"the image was specified using the {self.media_type} media type, "
                f"but the data is {actual}"
            )
        return self


class UrlSource(_Strict):
    type: Literal["url"]
    url: Url


class FileSource(_Strict):
    type: Literal["file"]
    file_id: FileId


class ImageTransformations(_Strict):
    oversized_image: Literal["downsize", "error"] = "downsize"


class ImageBlock(_Strict):
    type: Literal["image"]
    source: Annotated[
        Base64ImageSource | UrlSource | FileSource, pydantic.Field(discriminator="type")
    ]
    cache_control: CacheControl | None = None
    transformations: ImageTransformations | None = None


class Base64PdfSource(_Strict):
    type: Literal["base64"]
    media_type: Literal["application/pdf"]
    data: str

    @pydantic.model_validator(mode="after")
    def _data_is_a_pdf(self) -> Base64PdfSource:
        raw = decode_base64(self.data)
        if raw is None:
            raise ValueError("data is not valid base64 (standard alphabet, no line breaks)")
        if b"%PDF-" not in raw[:1024]:
            raise ValueError("data is not a PDF file")
        return self


class PlainTextSource(_Strict):
    type: Literal["text"]
    media_type: Literal["text/plain"]
    data: str


class ContentSource(_Strict):
    type: Literal["content"]
    content: str | list[Annotated[TextBlock | ImageBlock, pydantic.Field(discriminator="type")]]


class DocumentBlock(_Strict):
    type: Literal["document"]
    source: Annotated[
        Base64PdfSource | PlainTextSource | ContentSource | UrlSource | FileSource,
        pydantic.Field(discriminator="type"),
    ]
    cache_control: CacheControl | None = None
    citations: CitationsConfig | None = None
    context: str | None = None
    title: str | None = None


class SearchResultBlock(_Strict):
    type: Literal["search_result"]
    source: str
    title: str
    content: list[TextBlock]
    cache_control: CacheControl | None = None
    citations: CitationsConfig = CitationsConfig()


# What a tool_result's content and a run's first user message may hold.
BLOCK_TYPES = ("text", "image", "document", "search_result")
_BLOCK = pydantic.TypeAdapter(
    Annotated[
        TextBlock | ImageBlock | DocumentBlock | SearchResultBlock,
        pydantic.Field(discriminator="type"),
    ]
)


def validate_blocks(blocks: Any, *, where: str) -> list[dict[str, Any]]:
    """The blocks as plain JSON data, each validated, or InvalidContent naming the first
    bad one: `where[i] (type): field: problem`."""
    if not isinstance(blocks, list | tuple):
        raise InvalidContent(f"{where} must be a list of content blocks.")
    clean = []
    for i, block in enumerate(blocks):
        try:
            model = _BLOCK.validate_python(block)
        except pydantic.ValidationError as exc:
            raise InvalidContent(_describe(exc, f"{where}[{i}]", block)) from None
        clean.append(model.model_dump(mode="json", exclude_unset=True))
    return clean


def has_cache_control(value: Any) -> bool:
    """Whether a block (or anything inside it) sets a prompt-caching breakpoint."""
    if isinstance(value, dict):
        return "cache_control" in value or any(has_cache_control(v) for v in value.values())
    if isinstance(value, list):
        return any(has_cache_control(v) for v in value)
    return False


def _describe(exc: pydantic.ValidationError, where: str, block: Any) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    label = f"{where} ({kind})" if isinstance(kind, str) and kind in BLOCK_TYPES else where
    problems = []
    # Never the input values: they may be large (base64) or private.
    for error in exc.errors(include_url=False, include_input=False, include_context=False):
        loc = [str(part) for part in error["loc"]]
        if loc and loc[0] == kind:  # the union's tag: already in the label
            loc = loc[1:]
        message = error["msg"].removeprefix("Value error, ")
        problems.append(f"{'.'.join(loc)}: {message}" if loc else message)
    return f"{label}: {'; '.join(problems)}"


# --------------------------------------------------------------------------- results


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
    if result_format == ResultFormat.CONTENT and isinstance(value, list) and value:
        return value
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return canonical_json(value)
