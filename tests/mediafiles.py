"""Small real image and PDF files, built byte by byte (no binary fixtures, no Pillow)."""

from __future__ import annotations

import base64
import struct
import zlib


def png(width: int, height: int) -> bytes:
    """A black RGB PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + b"\x00" * width * 3 for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def jpeg(width: int, height: int) -> bytes:
    """A mid-grey baseline JPEG (one component). Each 8x8 block is a DC difference of 0
    and an end-of-block, so the Huffman tables need one code each ("0")."""

    def segment(marker: int, data: bytes) -> bytes:
        return struct.pack(">BBH", 0xFF, marker, len(data) + 2) + data

    app0 = b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    quant = b"\x00" + bytes([1] * 64)
    frame = struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00"
    one_code = bytes([1] + [0] * 15)  # one code of length 1
    dc_table = b"\x00" + one_code + b"\x00"  # class 0, id 0: symbol 0 (category 0)
    ac_table = b"\x10" + one_code + b"\x00"  # class 1, id 0: symbol 0x00 (end of block)
    scan = b"\x01\x01\x00\x00\x3f\x00"
    blocks = ((width + 7) // 8) * ((height + 7) // 8)
    bits = "00" * blocks
    bits += "1" * (-len(bits) % 8)  # pad with ones
    data = bytes(int(bits[i : i + 8], 2) for i in range(0, len(bits), 8))
    return (
        b"\xff\xd8"
        + segment(0xE0, app0)
        + segment(0xDB, quant)
        + segment(0xC0, frame)
        + segment(0xC4, dc_table)
        + segment(0xC4, ac_table)
        + segment(0xDA, scan)
        + data
        + b"\xff\xd9"
    )


def gif(width: int, height: int) -> bytes:
    """A black GIF. LZW with a clear code before every pixel, so codes stay 3 bits wide."""
    screen = struct.pack("<HHBBB", width, height, 0x80, 0, 0)  # global table of 2 colours
    palette = b"\x00\x00\x00\xff\xff\xff"
    image = b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0)
    codes = [4, 0] * (width * height) + [5]  # clear, colour 0, ..., end of information
    data = _pack_lsb([(code, 3) for code in codes])
    blocks = b"".join(
        bytes([len(data[i : i + 255])]) + data[i : i + 255] for i in range(0, len(data), 255)
    )
    return b"GIF89a" + screen + palette + image + b"\x02" + blocks + b"\x00\x3b"


def _pack_lsb(fields: list[tuple[int, int]]) -> bytes:
    """(value, bit width) fields packed least significant bit first (GIF, WebP lossless)."""
    number, shift = 0, 0
    for value, width in fields:
        number |= value << shift
        shift += width
    return number.to_bytes((shift + 7) // 8, "little")


def webp(width: int, height: int) -> bytes:
    """A black lossless WebP (VP8L): no transforms, no colour cache, and five one-symbol
    prefix codes, so every pixel takes zero bits."""
    fields = [(0x2F, 8), (width - 1, 14), (height - 1, 14), (0, 1), (0, 3)]
    fields += [(0, 1), (0, 1), (0, 1)]  # no transform, no colour cache, no meta prefix codes
    fields += [(1, 1), (0, 1), (0, 1), (0, 1)] * 5  # simple code: one 1-bit symbol, 0
    payload = _pack_lsb(fields)
    if len(payload) % 2:
        payload += b"\x00"
    chunk = b"VP8L" + struct.pack("<I", len(payload)) + payload
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def pdf(pages: int, *, compressed: bool = False) -> bytes:
    """A PDF with `pages` empty pages. `compressed`: the page objects live in a Flate
    object stream, indexed by a cross-reference stream (PDF 1.5), as most current tools
    write them; otherwise a classic cross-reference table."""
    kids = " ".join(f"{3 + i} 0 R" for i in range(pages))
    bodies = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        2: f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode(),
    }
    page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>"
    out = b"%PDF-1.5\n"
    offsets: dict[int, int] = {}

    def add(number: int, body: bytes) -> None:
        nonlocal out
        offsets[number] = len(out)
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"

    if not compressed:
        bodies.update({3 + i: page for i in range(pages)})
        for number, body in bodies.items():
            add(number, body)
        xref = len(out)
        out += f"xref\n0 {len(bodies) + 1}\n0000000000 65535 f \n".encode()
        out += b"".join(f"{offsets[n]:010d} 00000 n \n".encode() for n in sorted(offsets))
        out += f"trailer\n<< /Size {len(bodies) + 1} /Root 1 0 R >>\n".encode()
        return out + f"startxref\n{xref}\n%%EOF\n".encode()
    for number, body in bodies.items():
        add(number, body)
    stream_no, xref_no = 3 + pages, 4 + pages
    index, data = b"", b""
    for i in range(pages):
        index += f"{3 + i} {len(data)} ".encode()
        data += page + b" "
    packed = zlib.compress(index + data)
    add(
        stream_no,
        f"<< /Type /ObjStm /N {pages} /First {len(index)} /Length {len(packed)} "
        f"/Filter /FlateDecode >>\nstream\n".encode()
        + packed
        + b"\nendstream",
    )
    offsets[xref_no] = len(out)
    rows = [struct.pack(">BIH", 0, 0, 0xFFFF)]
    for number in range(1, xref_no + 1):
        if 3 <= number < stream_no:  # in the object stream, at its index
            rows.append(struct.pack(">BIH", 2, stream_no, number - 3))
        else:
            rows.append(struct.pack(">BIH", 1, offsets[number], 0))
    table = b"".join(rows)
    add(
        xref_no,
        f"<< /Type /XRef /Size {xref_no + 1} /W [1 4 2] /Root 1 0 R /Length {len(table)} >>"
        "\nstream\n".encode()
        + table
        + b"\nendstream",
    )
    return out + f"startxref\n{offsets[xref_no]}\n%%EOF\n".encode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
