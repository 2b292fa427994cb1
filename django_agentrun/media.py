"""Images and PDFs in base64: their format, size and what the Messages API bills for them.

Read from the file headers with the standard library only (no image or PDF library):
PNG, JPEG, GIF and WebP dimensions, and a PDF's page count.

The figures, from Anthropic's vision and PDF guides:

- An image costs about width * height / 750 tokens, measured after the API scales it
  down to at most 1568 px on the long edge and about 1.15 megapixels. The guide's table
  of the largest sizes it keeps as they are (1092x1092 ... 1568x784) reaches 1.23 MP,
  so we scale to that, the conservative end: at most 1,640 tokens. An image we cannot
  measure (a URL, a file id, an unreadable header) counts as that maximum.
- A PDF page costs its text (1,500 to 3,000 tokens, by density) plus the page as an
  image: we count PDF_PAGE_TOKENS = 3,000 + 1,640 = 4,640 tokens a page, the upper end.
  A PDF whose pages we cannot count (a URL, a file id, an encrypted or unusual file)
  counts as the API's maximum of 100 pages.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import struct
import zlib
from typing import Any

IMAGE_MAX_LONG_EDGE = 1568
IMAGE_MAX_PIXELS = 1568 * 784
PIXELS_PER_TOKEN = 750
IMAGE_MAX_TOKENS = math.ceil(IMAGE_MAX_PIXELS / PIXELS_PER_TOKEN)  # 1,640
PDF_PAGE_TOKENS = 3000 + IMAGE_MAX_TOKENS
PDF_MAX_PAGES = 100

IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


def decode_base64(data: str) -> bytes | None:
    """Strict base64 (what the API takes), or None."""
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def image_type(data: bytes) -> str | None:
    """The media type the file's signature says (one of IMAGE_TYPES), or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the header of a PNG, JPEG, GIF or WebP file, or None."""
    try:
        kind = image_type(data)
        if kind == "image/png" and data[12:16] == b"IHDR":
            return struct.unpack(">II", data[16:24])
        if kind == "image/gif":
            return struct.unpack("<HH", data[6:10])
        if kind == "image/jpeg":
            return _jpeg_size(data)
        if kind == "image/webp":
            return _webp_size(data)
    except (struct.error, IndexError):
        pass
    return None


# Start-of-frame markers carry the size; C4 (DHT), C8 (JPG) and CC (DAC) share the range.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # no length field
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if marker in _SOF:
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return width, height
        if marker == 0xDA:  # start of scan: no frame header before it
            return None
        i += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and data[20] == 0x2F:
        (bits,) = struct.unpack("<I", data[21:25])
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    return None


def image_tokens(width: int, height: int) -> int:
    """Tokens the API bills for a width x height image, after its own downscaling."""
    if width <= 0 or height <= 0:
        return IMAGE_MAX_TOKENS
    scale = min(
        1.0,
        IMAGE_MAX_LONG_EDGE / max(width, height),
        math.sqrt(IMAGE_MAX_PIXELS / (width * height)),
    )
    return max(1, math.ceil((width * scale) * (height * scale) / PIXELS_PER_TOKEN))


_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")
_OBJECT_STREAM = re.compile(rb"/Type\s*/ObjStm(?![A-Za-z])")
_STREAM = re.compile(rb"stream\r?\n")
_END_STREAM = b"endstream"
# Inflating object streams is bounded: a page count is not worth a decompression bomb.
_INFLATE_LIMIT = 16 * 1024 * 1024


def pdf_pages(data: bytes) -> int | None:
    """The number of page objects in a PDF, or None when none can be found (encrypted,
    or not a PDF). Pages inside compressed object streams (PDF 1.5+) are counted too.

    Linear in the file: one pass with a cursor that only moves forward (an object
    stream's dictionary, then its `stream` keyword, then its `endstream`), each stream
    inflated once from a view of the buffer (no copy), and at most _INFLATE_LIMIT
    bytes inflated in all. A file crafted with many object-stream dictionaries and no
    streams, or streams that never end, costs one scan, not one per match.
    """
    if b"%PDF-" not in data[:1024]:
        return None
    pages = len(_PAGE.findall(data))
    budget = _INFLATE_LIMIT
    view = memoryview(data)
    pos = 0
    while budget > 0:
        found = _OBJECT_STREAM.search(data, pos)
        if found is None:
            break
        start = _STREAM.search(data, found.end())
        if start is None:
            break
        end = data.find(_END_STREAM, start.end())
        if end < 0:
            end = len(data)
        try:
            inflated = zlib.decompressobj().decompress(view[start.end() : end], budget)
        except zlib.error:
            inflated = b""
        budget -= max(1, len(inflated))
        pages += len(_PAGE.findall(inflated))
        pos = end  # past this stream: what lies inside it is its data, not objects
    return pages or None


def block_tokens(block: dict[str, Any]) -> int | None:
    """Tokens of an image or PDF document block as the API bills them; None for any
    other block (its text is estimated as text)."""
    kind = block.get("type")
    source = block.get("source")
    if not isinstance(source, dict):
        return None
    if kind == "image":
        raw = decode_base64(source["data"]) if isinstance(source.get("data"), str) else None
        size = image_size(raw) if raw is not None and source.get("type") == "base64" else None
        return image_tokens(*size) if size else IMAGE_MAX_TOKENS
    if kind == "document" and source.get("type") in ("base64", "url", "file"):
        raw = decode_base64(source["data"]) if isinstance(source.get("data"), str) else None
        pages = pdf_pages(raw) if raw is not None and source.get("type") == "base64" else None
        return (pages or PDF_MAX_PAGES) * PDF_PAGE_TOKENS
    return None
