"""Content blocks: the models match the anthropic SDK's params, run input is validated
with them, and response blocks keep every key the API accepts back."""

from __future__ import annotations

import typing

import pytest
from anthropic import types as sdk
from rest_framework.test import APIClient

from django_agentrun import start_run
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.content import (
    Base64ImageSource,
    Base64PdfSource,
    CacheControl,
    CitationsConfig,
    ContentSource,
    DocumentBlock,
    FileSource,
    ImageBlock,
    ImageTransformations,
    PlainTextSource,
    SearchResultBlock,
    TextBlock,
    UrlSource,
    image_block,
    pdf_block,
)
from django_agentrun.exceptions import InvalidInput
from django_agentrun.models import Run, Turn
from django_agentrun.testing.messages_api import MessagesAPIServer, Reply, by_step, tool_use
from tests.conftest import drive
from tests.mediafiles import b64, jpeg, pdf, png

PAIRS = [
    (TextBlock, sdk.TextBlockParam),
    (ImageBlock, sdk.ImageBlockParam),
    (DocumentBlock, sdk.DocumentBlockParam),
    (SearchResultBlock, sdk.SearchResultBlockParam),
    (Base64ImageSource, sdk.Base64ImageSourceParam),
    (Base64PdfSource, sdk.Base64PDFSourceParam),
    (PlainTextSource, sdk.PlainTextSourceParam),
    (ContentSource, sdk.ContentBlockSourceParam),
    (UrlSource, sdk.URLImageSourceParam),
    (UrlSource, sdk.URLPDFSourceParam),
    (FileSource, sdk.FileImageSourceParam),
    (FileSource, sdk.FileDocumentSourceParam),
    (CacheControl, sdk.CacheControlEphemeralParam),
    (CitationsConfig, sdk.CitationsConfigParam),
    (ImageTransformations, sdk.ImageTransformationsParam),
]


@pytest.mark.parametrize("model, param", PAIRS, ids=[p.__name__ for _, p in PAIRS])
def test_models__have_the_sdk_params_keys_and_required_keys(model, param):
    hints = typing.get_type_hints(param, include_extras=True)
    required = {k for k, v in hints.items() if typing.get_origin(v) is typing.Required}
    assert set(model.model_fields) == set(hints)
    assert {k for k, f in model.model_fields.items() if f.is_required()} == required


# --------------------------------------------------------------------------- run input


@pytest.mark.django_db
def test_input__valid_blocks_start_a_run():
    blocks = [
        {"type": "text", "text": "Compare these."},
        image_block(png(20, 10)),
        image_block(jpeg(16, 16)),
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        pdf_block(pdf(2), title="Report"),
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}},
        {
            "type": "search_result",
            "source": "https://example.com/kb/1",
            "title": "KB 1",
            "content": [{"type": "text", "text": "Otters hold hands."}],
        },
    ]
    run = start_run("test-agent", blocks)
    assert run.input == blocks


@pytest.mark.django_db
@pytest.mark.parametrize(
    "bad, message",
    [
        ([{"type": "bogus"}], "input[0]: bogus blocks cannot start a run"),
        ([{"type": "thinking", "thinking": "hm"}], "input[0]: thinking blocks cannot start a run"),
        (
            [{"type": "text", "text": "ok"}, {"type": "image", "source": {"type": "base64"}}],
            "input[1] (image): source.base64.media_type: Field required",
        ),
        (
            [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "%%"},
                }
            ],
            "input[0] (image): source.base64: data is not valid base64",
        ),
        (
            [
                {
                    "type": "document",
                    "source": {
                        "type": "base64",
                        "media_type": "application/pdf",
                        "data": b64(png(1, 1)),
                    },
                }
            ],
            "input[0] (document): source.base64: data is not a PDF file",
        ),
        ([{"type": "text", "text": "hi", "cache": True}], "input[0] (text): cache: Extra inputs"),
        (
            [{"type": "search_result", "source": "s", "title": "t", "content": "x"}],
            "input[0] (search_result): content:",
        ),
    ],
    ids=["unknown", "thinking", "no media type", "bad base64", "not a pdf", "extra key", "content"],
)
def test_input__bad_blocks_are_refused_naming_the_block_and_the_problem(bad, message):
    with pytest.raises(InvalidInput) as raised:
        start_run("test-agent", bad)
    assert message in str(raised.value)
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_input__at_most_two_cache_breakpoints():
    """The API takes 4 a request and the model client places 2 (tools, system)."""

    def marked(i):
        return {"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral"}}

    assert start_run("test-agent", [marked(1), marked(2)]).input[1]["cache_control"]
    with pytest.raises(InvalidInput, match="At most 2 input blocks may set cache_control"):
        start_run("test-agent", [marked(1), marked(2), marked(3)])


@pytest.mark.django_db
def test_input__the_api_answers_400_for_a_bad_block():
    from django.contrib.auth.models import User
    from django.urls import reverse

    api = APIClient()
    api.force_authenticate(User.objects.create_user("ann"))
    response = api.post(
        reverse("agentrun:run-list"),
        {"agent": "test-agent", "input": [{"type": "bogus"}]},
        format="json",
    )
    assert response.status_code == 400
    assert "input[0]: bogus blocks cannot start a run" in response.json()["errors"]["input"][0]
    assert not Run.objects.exists()


# --------------------------------------------------------------------------- response blocks


@pytest.mark.django_db
@pytest.mark.timeout(20)
def test_response_blocks__toolset_name_and_citations_are_sent_back():
    citation = {
        "type": "char_location",
        "cited_text": "Otters hold hands.",
        "document_index": 0,
        "document_title": None,
        "start_char_index": 0,
        "end_char_index": 18,
    }
    first = Reply(
        [
            {"type": "text", "text": "Otters hold hands.", "citations": [citation]},
            {**tool_use("lookup", {"query": "otters"}), "toolset_name": "facts"},
        ]
    )
    with MessagesAPIServer(by_step([first, Reply("Done.")]), api_key="k") as api:
        client = AnthropicModelClient(base_url=api.base_url, api_key="k", max_retries=0)
        run = start_run("test-agent", "otters?")
        drive(run, client)
        client.close()
    assert run.state == "completed"
    recorded = Turn.objects.get(run=run, index=0).content
    sent_back = api.bodies[1]["messages"][1]["content"]
    assert sent_back == recorded
    assert sent_back[0]["citations"] == [citation]  # document_title kept although null
    assert sent_back[1]["toolset_name"] == "facts"
    assert set(sent_back[1]) == {"type", "id", "name", "input", "toolset_name"}
