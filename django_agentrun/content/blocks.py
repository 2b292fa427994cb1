"""Content block models: what a tool_result's content and a run's first user message may hold.

They mirror the `anthropic` SDK's param types (TextBlockParam, ImageBlockParam,
DocumentBlockParam, SearchResultBlockParam: a test keeps them in step) and refuse
what the Messages API refuses: unknown block types and keys, missing fields, blank
text, bad base64, image data that is not the declared type.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import pydantic

from ..exceptions import InvalidContent
from ..media import decode_base64, image_type


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
