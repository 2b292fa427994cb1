"""Budgets and media: images and PDFs are estimated the way the API bills them, not by the
length of their base64 (a 300 KB image is not 100k tokens)."""

from __future__ import annotations

import os

import pytest

from django_agentrun import Agent, Budget, SideEffect, ToolResult, start_run, tool
from django_agentrun.content import image_block, pdf_block
from django_agentrun.engine.guards import estimate_tokens
from django_agentrun.media import (
    IMAGE_MAX_TOKENS,
    PDF_MAX_PAGES,
    PDF_PAGE_TOKENS,
    image_size,
    image_tokens,
    pdf_pages,
)
from django_agentrun.models import RunEvent
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.conftest import drive
from tests.mediafiles import b64, gif, jpeg, pdf, png, webp

# What the run asks the model (the request's rules), not how its rows are stored: the same on
# any Postgres driver and binding (the store's statements run in the other modules).
pytestmark = pytest.mark.one_driver


@pytest.mark.parametrize(
    "make, size",
    [(png, (640, 480)), (jpeg, (200, 104)), (gif, (30, 20)), (webp, (1000, 3000))],
    ids=["png", "jpeg", "gif", "webp"],
)
def test_media__image_dimensions_from_the_header(make, size):
    assert image_size(make(*size)) == size


def test_media__unreadable_images_have_no_size():
    assert image_size(b"not an image") is None
    assert image_size(b"\x89PNG\r\n\x1a\n") is None  # cut short
    assert image_size(b"\xff\xd8\xff\xda\x00\x02") is None  # a scan before any frame


def test_media__image_tokens_after_the_apis_downscaling():
    assert image_tokens(200, 150) == 40  # 30,000 px / 750
    assert image_tokens(1092, 1092) == 1590  # ~1.19 MP: scaled to 1.15 MP
    assert image_tokens(8000, 2000) == 1568 * 392 // 750 + 1  # long edge to 1568
    assert image_tokens(4000, 4000) <= IMAGE_MAX_TOKENS


def test_media__pdf_pages_plain_and_in_object_streams():
    assert pdf_pages(pdf(3)) == 3
    assert pdf_pages(pdf(7, compressed=True)) == 7
    assert pdf_pages(b"%PDF-1.7\nencrypted or odd") is None
    assert pdf_pages(png(1, 1)) is None


def test_estimate__a_large_image_costs_its_billed_tokens_not_its_base64_length():
    big = png(1500, 1000)
    big += os.urandom(300_000)  # trailing bytes: the file is as large as a real photo
    block = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": b64(big)},
    }
    assert len(block["source"]["data"]) // 4 > 100_000  # what the old estimate charged
    tokens = estimate_tokens([{"type": "text", "text": "What is this?"}, block])
    assert image_tokens(1500, 1000) <= tokens < image_tokens(1500, 1000) + 50


def test_estimate__url_and_unreadable_images_count_as_the_maximum():
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    junk = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
    }
    assert IMAGE_MAX_TOKENS <= estimate_tokens([url]) < IMAGE_MAX_TOKENS + 50
    assert IMAGE_MAX_TOKENS <= estimate_tokens([junk]) < IMAGE_MAX_TOKENS + 50


def test_estimate__pdfs_per_page_and_unknown_ones_at_the_page_limit():
    four = pdf_block(pdf(4, compressed=True))
    assert 4 * PDF_PAGE_TOKENS <= estimate_tokens([four]) < 4 * PDF_PAGE_TOKENS + 50
    url = {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}
    assert estimate_tokens([url]) >= PDF_MAX_PAGES * PDF_PAGE_TOKENS
    plain = {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "x" * 400},
    }
    assert 100 <= estimate_tokens([plain]) < 150  # text documents are text


def test_estimate__images_inside_tool_results_and_content_documents():
    image = image_block(jpeg(800, 600))
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [image]}
    nested = {"type": "document", "source": {"type": "content", "content": [image]}}
    for value in (result, nested):
        assert image_tokens(800, 600) <= estimate_tokens([value]) < image_tokens(800, 600) + 60


Agent(
    name="media-budget",
    model="claude-sonnet-4-6",
    max_tokens=500,
    budget=Budget(max_input_tokens=20_000),
)


@pytest.mark.django_db
def test_budget__a_run_with_a_large_image_input_is_not_refused_before_it_starts():
    """The old estimate counted the image's base64 as text (~130k tokens) and failed the run
    with budget_exceeded before any request; billed as an image it is ~1,600."""
    photo = png(1500, 1000) + os.urandom(400_000)
    run = start_run("media-budget", [{"type": "text", "text": "Describe it."}, image_block(photo)])
    client = ScriptedClient([reply(text("A black rectangle."))])
    drive(run, client)
    assert run.state == "completed", run.error_message
    assert len(client.requests) == 1


@pytest.mark.django_db
def test_budget__a_pdf_too_large_for_the_budget_is_refused_before_the_request():
    run = start_run("media-budget", [pdf_block(pdf(5)), {"type": "text", "text": "Summarize."}])
    client = ScriptedClient([reply(text("never asked"))])
    drive(run, client)
    assert (run.state, run.error_code) == ("failed", "budget_exceeded")
    assert client.requests == []
    breach = RunEvent.objects.get(run=run, type="budget_exceeded").payload
    assert breach["limit"] == "max_input_tokens" and breach["projected"] > 5 * PDF_PAGE_TOKENS


@tool(side_effect=SideEffect.READ_ONLY)
def big_chart() -> ToolResult:
    """A chart as a large PNG."""
    return ToolResult(image_block(png(1200, 900) + os.urandom(200_000)))


Agent(
    name="chart-budget",
    model="claude-sonnet-4-6",
    max_tokens=500,
    tools=[big_chart],
    budget=Budget(max_input_tokens=4_000),
)


@pytest.mark.django_db
def test_budget__rich_tool_results_are_estimated_as_media():
    """The estimate of the turn after a tool: last prompt + output + the new results, the
    image result priced as an image (its base64 alone is ~70k characters)."""
    usage = {"input_tokens": 100, "output_tokens": 20}
    client = ScriptedClient(
        [reply(tool_use("big_chart", {}), usage=usage), reply(text("Done."), usage=usage)]
    )
    run = start_run("chart-budget", "Draw it.")
    drive(run, client)
    assert run.state == "completed", run.error_message
    assert len(client.requests) == 2
