"""Tool results: JSON values or validated content blocks (ToolResult), stored as values,
rendered when the history is built; a history the API refuses fails the run with
`history_rejected`, and a person repairs it with replace_tool_result."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from rest_framework.test import APIClient

from django_agentrun import ToolResult, replace_tool_result, resolve_tool_call, resume_run
from django_agentrun.clients import ModelError
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.content import ResultFormat, image_block, render_result
from django_agentrun.engine.history import model_failure
from django_agentrun.engine.projection import project
from django_agentrun.exceptions import InvalidContent, InvalidTransition
from django_agentrun.models import RunEvent, ToolCall
from django_agentrun.states import RunState, ToolCallState
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from django_agentrun.testing.messages_api import MessagesAPIServer, Reply, by_step, validate_request
from django_agentrun.testing.messages_api import text as api_text
from django_agentrun.testing.messages_api import tool_use as api_tool_use
from tests.conftest import drive
from tests.mediafiles import png

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(20)]

RECORDS = [{"type": "checking", "balance": 10}, {"type": "savings", "balance": 250}]


def body_of(request):
    return json.loads(
        json.dumps(
            {
                "model": request.model,
                "max_tokens": request.max_tokens,
                "messages": request.messages,
                "tools": request.tools,
            }
        )
    )


def last_results(request):
    """The tool_result blocks of the request's last user message."""
    return [b for b in request.messages[-1]["content"] if b["type"] == "tool_result"]


def run_tool(name, arguments=None, agent="results"):
    from django_agentrun import start_run

    client = ScriptedClient(
        [reply(tool_use(name, arguments or {}, id="toolu_a")), reply(text("Done."))]
    )
    run = start_run(agent, "go")
    drive(run, client)
    return run, client, ToolCall.objects.get(run=run)


# --------------------------------------------------------------------------- JSON values


def test_json__records_with_a_type_key_are_a_json_value_not_content_blocks():
    run, client, call = run_tool("list_accounts", {"owner": "ann"})
    assert run.state == RunState.COMPLETED
    assert (call.result, call.result_format, call.is_error) == (RECORDS, "json", False)
    (result,) = last_results(client.requests[1])
    assert json.loads(result["content"]) == RECORDS  # JSON text the model reads
    for request in client.requests:
        validate_request(body_of(request))  # the API takes it (blocks "checking" would be a 400)


def test_json__a_dict_is_stored_as_the_value_and_sent_as_canonical_json():
    run, client, call = run_tool("lookup", {"query": "otters"})
    assert call.result == {"query": "otters", "answer": "fact about otters"}
    (result,) = last_results(client.requests[1])
    assert result["content"] == '{"answer":"fact about otters","query":"otters"}'
    finished = RunEvent.objects.get(run=run, type="tool_call_finished")
    assert finished.payload["result"] == call.result
    assert finished.payload["result_format"] == "json"


def test_json__the_api_shows_the_value_not_json_inside_a_string():
    user = User.objects.create_user("ann")
    run, _, call = run_tool("lookup", {"query": "otters"})
    run.owner = user
    run.save(update_fields=["owner"])
    api = APIClient()
    api.force_authenticate(user)
    detail = api.get(reverse("agentrun:run-detail", args=[run.pk])).json()
    (shown,) = [c for t in detail["turns"] for c in t["tool_calls"]]
    assert shown["result"] == {"query": "otters", "answer": "fact about otters"}
    events = api.get(reverse("agentrun:run-events", args=[run.pk])).json()["results"]
    finished = next(e for e in events if e["type"] == "tool_call_finished")
    assert finished["payload"]["result"] == shown["result"]


def test_json__a_result_that_is_not_json_is_an_error_result_and_the_run_goes_on():
    run, client, call = run_tool("ratio")
    assert (call.state, call.is_error) == (ToolCallState.ERRORED, True)
    assert "not a JSON value" in call.result and "bug in the tool" in call.result
    assert run.state == RunState.COMPLETED


# --------------------------------------------------------------------------- rich content


def test_content__a_tool_result_is_sent_as_its_blocks():
    run, client, call = run_tool("chart", {"quarter": "Q3"})
    assert call.result_format == "content"
    (result,) = last_results(client.requests[1])
    assert [b["type"] for b in result["content"]] == ["text", "image"]
    assert result["content"][1]["source"]["media_type"] == "image/png"
    validate_request(body_of(client.requests[1]))
    assert RunEvent.objects.get(run=run, type="tool_call_finished").payload["result_format"] == (
        "content"
    )


def test_content__invalid_blocks_are_an_error_result_that_says_why():
    run, client, call = run_tool("broken_chart")
    assert (call.state, call.is_error) == (ToolCallState.ERRORED, True)
    assert "content[0] (image)" in call.result and "source.base64" in call.result
    assert "bug in the tool" in call.result
    assert run.state == RunState.COMPLETED
    validate_request(body_of(client.requests[1]))


@pytest.mark.parametrize(
    "blocks, problem",
    [
        ([{"type": "checking", "balance": 10}], "does not match any of the expected tags"),
        ([{"type": "text", "text": "  "}], "non-whitespace"),
        ([{"type": "text", "text": "a", "colour": "red"}], "colour: Extra inputs"),
        ([{"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}}], "http(s)"),
        (
            [{"type": "document", "source": {"type": "base64", "media_type": "application/pdf"}}],
            "data",
        ),
        ([{"type": "search_result", "source": "s", "title": "t"}], "content: Field required"),
    ],
    ids=["unknown type", "blank text", "unknown key", "bad url", "no data", "no content"],
)
def test_content__tool_result_validates_when_built(blocks, problem):
    with pytest.raises(InvalidContent, match="content\\[0\\]") as raised:
        ToolResult(blocks)
    assert problem in str(raised.value)


def test_content__tool_results_set_no_cache_breakpoints():
    """The engine places breakpoints; a tool's would pile up past the API's 4 a request."""
    nested = {
        "type": "search_result",
        "source": "kb",
        "title": "KB",
        "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}],
    }
    with pytest.raises(InvalidContent, match="content\\[1\\]: cache_control is not allowed"):
        ToolResult("ok", nested)


def test_content__image_data_must_be_the_declared_type():
    block = image_block(png(2, 2))
    block["source"]["media_type"] = "image/jpeg"
    with pytest.raises(InvalidContent, match="image/jpeg media type, but the data is image/png"):
        ToolResult(block)


def test_legacy__rows_and_events_without_a_format_render_as_json_text():
    """Before formats, a list of dicts was passed through as blocks; now it renders as the
    JSON text it is, so a run stuck on such a result is accepted again on resume."""
    assert render_result(RECORDS) == json.dumps(RECORDS, sort_keys=True, separators=(",", ":"))
    assert ToolCall(result=RECORDS).tool_result_block()["content"] == render_result(RECORDS)
    assert ToolCall._meta.get_field("result_format").default == ResultFormat.JSON
    events = [
        (1, "run_created", {"input": "go"}),
        (
            2,
            "model_response",
            {"turn_index": 0, "content": [tool_use("x", id="toolu_x")], "usage": {}},
        ),
        (3, "tool_call_requested", {"turn_index": 0, "tool_call_id": "toolu_x", "position": 0}),
        (
            4,
            "tool_call_finished",
            {
                "turn_index": 0,
                "tool_call_id": "toolu_x",
                "tool_call_state": "succeeded",
                "result": RECORDS,
            },
        ),
    ]
    (result,) = project(events).messages[-1]["content"]
    assert result["content"] == render_result(RECORDS)


# --------------------------------------------------------------------------- a person's result


@pytest.fixture
def unknown_call(monkeypatch):
    """A charge_card call (non_idempotent, no reconcile) found in flight: outcome unknown."""
    from datetime import timedelta

    from django.utils import timezone

    from django_agentrun import start_run
    from django_agentrun.failpoints import FailpointError
    from django_agentrun.models import Run

    client = ScriptedClient(
        [reply(tool_use("charge_card", {"amount_cents": 5})), reply(text("ok"))]
    )
    run = start_run("test-agent", "charge")
    monkeypatch.setenv("AGENTRUN_FAILPOINTS", "tool.before_handler=raise")
    with pytest.raises(FailpointError):
        drive(run, client)
    monkeypatch.delenv("AGENTRUN_FAILPOINTS")
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    drive(run, client)
    call = ToolCall.objects.get(run=run)
    assert call.state == ToolCallState.UNKNOWN
    return run, call, client


def test_resolve__done_with_a_value_stores_the_value(unknown_call):
    run, call, client = unknown_call
    resolve_tool_call(call, by=None, action="done", result={"charge_id": "ch_1"})
    call.refresh_from_db()
    assert (call.result, call.result_format) == ({"charge_id": "ch_1"}, "json")
    drive(run, client)
    assert last_results(client.requests[-1])[0]["content"] == '{"charge_id":"ch_1"}'


def test_resolve__done_with_a_tool_result_stores_blocks(unknown_call):
    run, call, client = unknown_call
    resolve_tool_call(call, by=None, action="done", result=ToolResult("Charged 5 cents."))
    call.refresh_from_db()
    assert call.result_format == "content"
    assert call.tool_result_block()["content"] == [{"type": "text", "text": "Charged 5 cents."}]
    drive(run, client)
    assert run.state == RunState.COMPLETED


def test_resolve__done_with_no_json_value_is_refused_and_writes_nothing(unknown_call):
    run, call, _ = unknown_call
    seq = run.last_seq
    with pytest.raises(InvalidContent, match="not a JSON value"):
        resolve_tool_call(call, by=None, action="done", result={"x": float("inf")})
    call.refresh_from_db()
    run.refresh_from_db()
    assert (call.state, run.last_seq) == (ToolCallState.UNKNOWN, seq)


# --------------------------------------------------------------------------- rejected history


def test_model_failure__a_refused_history_has_its_own_code():
    def code(message, status=400, retryable=False):
        return model_failure(ModelError(message, status=status, retryable=retryable))[0]

    assert code("400 invalid_request_error: messages.2.content.0.tool_result.content.0: bad") == (
        "history_rejected"
    )
    assert code("400 invalid_request_error: Could not process image") == "history_rejected"
    assert code("400 invalid_request_error: Unable to download the file") == "history_rejected"
    assert code("413 request_too_large: Request exceeds the maximum size", 413) == (
        "history_rejected"
    )
    too_many = (
        "400 invalid_request_error: A maximum of 4 blocks with cache_control may be provided."
    )
    assert code(too_many) == "history_rejected"
    assert code("400 invalid_request_error: Your credit balance is too low") == "model_error"
    assert code("ScriptedClient: no reply scripted for step 3") == "model_error"
    assert code("401 authentication_error: invalid x-api-key", status=401) == "model_error"
    assert code("529 overloaded_error: busy", status=529, retryable=True) == "model_unavailable"
    message = model_failure(ModelError("400 invalid_request_error: messages: x", status=400))[1]
    assert message.index("replace_tool_result") < message.index("messages: x")


@pytest.fixture
def api_server():
    script = by_step(
        [
            Reply([api_text("Let me draw it."), api_tool_use("chart", {"quarter": "Q3"})]),
            Reply(
                [
                    api_text("And the linked one."),
                    api_tool_use("linked_chart", {"url": "https://charts.example.invalid/q3.png"}),
                ]
            ),
            Reply("Here are both charts."),
        ]
    )
    with MessagesAPIServer(script, api_key="sk-test") as server:
        yield server


@pytest.fixture
def sdk_client(api_server):
    client = AnthropicModelClient(base_url=api_server.base_url, api_key="sk-test", max_retries=0)
    yield client
    client.close()


def test_story__rejected_history_fails_then_a_person_repairs_it_and_the_run_completes(
    api_server, sdk_client
):
    """Through the real SDK and the stand-in: a rich result is accepted; a URL the API
    cannot download makes it refuse the history: the run fails with history_rejected
    (once, not in a loop); a person replaces that result; resume completes the run."""
    from django_agentrun import start_run

    ann = User.objects.create_user("ann")
    run = start_run("results", "Show me the Q3 charts.")
    drive(run, sdk_client)

    assert run.state == RunState.FAILED and run.error_code == "history_rejected"
    assert "Unable to download the file" in run.error_message
    assert api_server.steps() == {0: 1, 1: 1, 2: 1}  # step 2 was refused once, not retried
    statuses = [r["status"] for r in api_server.requests]
    assert statuses == [200, 200, 400]
    image = api_server.bodies[1]["messages"][-1]["content"][0]["content"][1]
    assert image["type"] == "image" and image["source"]["media_type"] == "image/png"

    linked = ToolCall.objects.get(run=run, name="linked_chart")
    replace_tool_result(linked, by=ann, result="The chart link has expired.", note="dead link")
    event = RunEvent.objects.filter(run=run).latest("seq")
    assert event.type == "tool_result_replaced"
    assert (event.payload["by"], event.payload["note"]) == (ann.pk, "dead link")
    linked.refresh_from_db()
    assert (linked.result, linked.result_format, linked.result_source) == (
        "The chart link has expired.",
        "json",
        "person",
    )

    resume_run(run, by=ann)
    drive(run, sdk_client)
    assert run.state == RunState.COMPLETED
    assert api_server.steps() == {0: 1, 1: 1, 2: 2}
    sent = api_server.bodies[-1]["messages"][-1]["content"][0]
    assert sent == {
        "type": "tool_result",
        "tool_use_id": linked.tool_call_id,
        "content": "The chart link has expired.",
    }


def test_replace__only_a_closed_call_of_a_stopped_run(unknown_call):
    run, call, client = unknown_call
    with pytest.raises(InvalidTransition, match="awaiting_approval"):
        replace_tool_result(call, by=None, result="x")  # the run waits for a person
    from django_agentrun import cancel_run

    cancel_run(run)
    call.refresh_from_db()
    assert call.state == ToolCallState.CANCELLED
    with pytest.raises(InvalidContent):
        replace_tool_result(call, by=None, result=[float("nan")])
    replace_tool_result(call, by=None, result=ToolResult("Charged after all."), is_error=False)
    call.refresh_from_db()
    assert (call.state, call.result_format, call.is_error) == (
        ToolCallState.CANCELLED,
        "content",
        False,
    )
