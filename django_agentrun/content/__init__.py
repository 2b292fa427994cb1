"""Content blocks: rich tool results (`ToolResult`), a run's input, and how a stored tool
result becomes tool_result content.

The block models mirror the `anthropic` SDK's param types (TextBlockParam,
ImageBlockParam, DocumentBlockParam, SearchResultBlockParam: a test keeps them in
step) and refuse what the Messages API refuses: unknown block types and keys, missing
fields, blank text, bad base64, image data that is not the declared type. A block
that passes may still be refused by the API for what only it can check (a URL it
cannot download, an image too large): the run then fails with `history_rejected`,
and `services.replace_tool_result` repairs it.

Where things are: `blocks` (the block models and `validate_blocks`) and `results`
(ToolResult, the block builders, storing and rendering results). Every name is
importable from here, as it was when this was one module.
"""

from __future__ import annotations

from .blocks import (
    BLOCK_TYPES,
    Base64ImageSource,
    Base64PdfSource,
    CacheControl,
    Citation,
    CitationsConfig,
    ContentSource,
    DocumentBlock,
    FileId,
    FileSource,
    ImageBlock,
    ImageTransformations,
    PlainTextSource,
    SearchResultBlock,
    TextBlock,
    Url,
    UrlSource,
    has_cache_control,
    validate_blocks,
)
from .results import (
    ResultFormat,
    StoredResult,
    ToolResult,
    image_block,
    json_value,
    pdf_block,
    render_result,
    stored_result,
    text_block,
)

__all__ = [
    "BLOCK_TYPES",
    "Base64ImageSource",
    "Base64PdfSource",
    "CacheControl",
    "Citation",
    "CitationsConfig",
    "ContentSource",
    "DocumentBlock",
    "FileId",
    "FileSource",
    "ImageBlock",
    "ImageTransformations",
    "PlainTextSource",
    "ResultFormat",
    "SearchResultBlock",
    "StoredResult",
    "TextBlock",
    "ToolResult",
    "Url",
    "UrlSource",
    "has_cache_control",
    "image_block",
    "json_value",
    "pdf_block",
    "render_result",
    "stored_result",
    "text_block",
    "validate_blocks",
]
