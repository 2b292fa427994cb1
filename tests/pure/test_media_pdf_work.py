"""The PDF page count is bounded in work: linear in the file, whatever its shape.

Before: pdf_pages rescanned the rest of the buffer for a `stream` keyword, and copied the
rest of the buffer for zlib, once per `/Type /ObjStm` match, so a 2.5 MB crafted PDF took
the worker minutes of CPU (about ten for the first shape below) before the first turn.
"""

from __future__ import annotations

import time
import zlib

import pytest

from django_agentrun.media import PDF_PAGE_TOKENS, block_tokens, pdf_pages
from tests.mediafiles import b64, pdf

SIZE = 2_500_000
# Generous: the linear count takes milliseconds; the old one took minutes.
BOUND_SECONDS = 5.0


def crafted(unit: bytes, tail: bytes = b"") -> bytes:
    head = b"%PDF-1.7\n"
    return head + unit * ((SIZE - len(head) - len(tail)) // len(unit)) + tail


SHAPES = {
    # Many object-stream dictionaries and one `stream` at the very end: each match
    # searched to the end of the file.
    "dictionaries_then_one_stream": crafted(b"/Type/ObjStm ", b"stream\n"),
    # Each dictionary with a `stream` that never ends: each match copied the rest.
    "streams_that_never_end": crafted(b"/Type/ObjStm\nstream\n"),
    # Each with an invalid Flate body and an end.
    "broken_streams": crafted(b"/Type/ObjStm\nstream\nxx\nendstream\n"),
}


@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_pdf_pages__a_crafted_pdf_costs_one_pass(shape):
    data = SHAPES[shape]
    assert len(data) > 2_400_000
    started = time.process_time()
    pages = pdf_pages(data)
    assert time.process_time() - started < BOUND_SECONDS
    assert pages is None  # no page objects anywhere
    # And as the budget estimate sees it (a base64 document block): the API's maximum.
    started = time.process_time()
    block = {"type": "document", "source": {"type": "base64", "data": b64(data)}}
    assert block_tokens(block) == 100 * PDF_PAGE_TOKENS
    assert time.process_time() - started < BOUND_SECONDS


def test_pdf_pages__real_object_streams_still_counted_after_junk():
    # Pages in a Flate object stream that follows junk dictionaries, and plain pages.
    objects = b" ".join(b"<< /Type /Page /Parent 2 0 R >>" for _ in range(4))
    body = zlib.compress(objects)
    data = (
        b"%PDF-1.7\n"
        + b"/Type/ObjStm " * 1000
        + b"9 0 obj\n<< /Type /ObjStm /N 4 /Filter /FlateDecode >>\nstream\n"
        + body
        + b"\nendstream\nendobj\n"
        + b"3 0 obj\n<< /Type /Page >>\nendobj\n"
    )
    assert pdf_pages(data) == 5
    assert pdf_pages(pdf(9, compressed=True)) == 9


def test_pdf_pages__inflating_is_bounded():
    # A decompression bomb in an object stream: 64 MB of page objects, 16 MB read.
    bomb = zlib.compress(b"/Type /Page " * (64 * 1024 * 1024 // 12), 9)
    data = b"%PDF-1.7\n<< /Type /ObjStm >>\nstream\n" + bomb + b"\nendstream\n"
    started = time.process_time()
    pages = pdf_pages(data)
    assert time.process_time() - started < BOUND_SECONDS
    assert pages is not None and pages <= 16 * 1024 * 1024 // 12 + 1
