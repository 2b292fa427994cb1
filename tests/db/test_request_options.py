"""Request options an Agent (and a run) sets, each through the real SDK to the Messages API
stand-in (the request body as it recorded it), stop reasons and their outcomes, and what
the API, the events and the admin show of thinking."""

from __future__ import annotations

from datetime import timedelta

import pydantic
import pytest
from django.core.management import call_command
from django.urls import reverse

from django_agentrun import send_message, start_conversation, start_run
from django_agentrun.agents import Agent, get_agent, owner_user_id, unregister_agent
from django_agentrun.checks import check_agents
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.engine import advance
from django_agentrun.engine.history import CONTINUE_NOTICE
from django_agentrun.engine.projection import project
from django_agentrun.exceptions import ConfigurationError, InvalidOption, OptionRefused
from django_agentrun.failpoints import FailpointError
from django_agentrun.models import Run, RunEvent
from django_agentrun.testing.messages_api import Reply, step_of, text, tool_use
from tests import factories
from tests.conftest import assert_api_error, drive
from tests.factories import ELSEWHERE, by_message, expire

# What the run asks the model (the request's rules), not how its rows are stored: the same on
# any Postgres driver and binding (the store's statements run in the other modules).
pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]

CURRENT = "claude-sonnet-5-5"  # a current model: adaptive thinking, effort, format
LEGACY = "claude-haiku-4-5"  # no effort, no adaptive thinking


class Answer(pydantic.BaseModel):
    city: str
    population: int


@pytest.fixture
def claude(messages_api):
    c = AnthropicModelClient(base_url=messages_api.base_url, api_key="test-key")
    yield c
    c.close()


@pytest.fixture
def agents():
    """Define agents for one test (registered by name, forgotten after)."""
    made: list[str] = []

    def make(name: str, **options) -> Agent:
        options.setdefault("model", CURRENT)
        made.append(name)
        return Agent(name=name, **options)

    yield make
    for name in made:
        unregister_agent(name)


def lookup():
    return get_agent("chat").tools["lookup"]


def accepted(api) -> None:
    assert [(r["status"], r["error"]) for r in api.requests if r["status"] != 200] == []


# --------------------------------------------------------------------------- options


def test_options__each_reaches_the_request_as_the_sdk_names_it(messages_api, claude, agents):
    agents(
        "opts",
        system=[{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Rules."}],
        tools=[lookup()],
        thinking="adaptive",
        thinking_display="summarized",
        effort="high",
        parallel_tool_use=False,
        stop_sequences=["END"],
        service_tier="auto",
        strict_tools=True,
    )
    owner = factories.user("mallory", email="mallory@example.com")
    messages_api.script = lambda body: Reply("Done.")
    run = start_run("opts", "hi", owner=owner)
    drive(run, claude)
    accepted(messages_api)
    body = messages_api.bodies[0]
    assert body["thinking"] == {"type": "adaptive", "display": "summarized"}
    assert body["output_config"] == {"effort": "high"}
    assert body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert body["stop_sequences"] == ["END"]
    assert body["service_tier"] == "auto"
    assert [b["text"] for b in body["system"]] == ["You are terse.", "Rules."]
    assert body["tools"][0]["strict"] is True
    assert body["tools"][0]["input_schema"]["additionalProperties"] is False
    # An opaque id of the owner: stable, never their e-mail or name.
    user_id = body["metadata"]["user_id"]
    assert user_id == owner_user_id(owner) and len(user_id) == 32
    assert "mallory" not in user_id and str(owner.pk) != user_id
    assert run.state == "completed"


def test_options__thinking_off_and_tool_choice_none(messages_api, claude, agents):
    agents("quiet", tools=[lookup()], thinking="off", tool_choice="none")
    messages_api.script = lambda body: Reply("No tools.")
    run = start_run("quiet", "hi")
    drive(run, claude)
    accepted(messages_api)
    # The default model (Sonnet 5.5) refuses "disabled": its lowest setting is sent.
    assert messages_api.bodies[0]["thinking"] == {"type": "between_tools"}
    assert messages_api.bodies[0]["tool_choice"] == {"type": "none"}
    assert "metadata" not in messages_api.bodies[0]  # no owner, no user id


def test_options__a_run_overrides_the_agents(messages_api, claude, agents):
    agents("tunable", effort="high", thinking="adaptive")
    messages_api.script = lambda body: Reply("ok")
    run = start_run("tunable", "hi", options={"effort": "low", "thinking_display": "omitted"})
    drive(run, claude)
    body = messages_api.bodies[0]
    assert body["output_config"] == {"effort": "low"}
    assert body["thinking"] == {"type": "adaptive", "display": "omitted"}
    assert get_agent("tunable").options["effort"] == "high"  # the agent is unchanged


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"thinking": "sometimes"}, "thinking must be one of adaptive, between_tools, off"),
        ({"thinking_display": "summarized"}, 'thinking_display needs thinking="adaptive"'),
        ({"effort": "extreme"}, "effort must be one of low, medium, high, xhigh, max"),
        ({"service_tier": "priority"}, "service_tier must be one of auto, standard_only"),
        ({"stop_sequences": "END"}, "stop_sequences must be a list of non-blank strings"),
        ({"tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice names no tool"),
        ({"tool_choice": "sometimes"}, "tool_choice must be one of auto, none, any, tool"),
        ({"output_format": {"type": "object"}}, "additionalProperties to false"),
        ({"output_format": {"type": "array", "items": {}}}, 'root of the schema must be {"type'),
        ({"output_format": "json"}, "output_format must be a pydantic model class or a JSON"),
        ({"system": [{"type": "image"}]}, "system[0] must be a text block"),
        ({"context": "Monday"}, "context must be a callable"),
    ],
)
def test_agent__bad_option_values_fail_where_it_is_defined(agents, options, says):
    with pytest.raises(ConfigurationError, match="Agent bad") as caught:
        agents("bad", **options)
    assert says in str(caught.value)


def test_run_options__bad_values_rejected_at_start_run(agents):
    agents("tunable2")
    with pytest.raises(InvalidOption, match="Unknown run option.*tool_choice"):
        start_run("tunable2", "hi", options={"tool_choice": "none"})
    with pytest.raises(InvalidOption, match="effort must be one of"):
        start_run("tunable2", "hi", options={"effort": 3})
    assert not Run.objects.filter(agent="tunable2").exists()


def test_refused_option__fails_at_check_and_at_start_run_naming_option_and_model(agents):
    agents("old-effort", model=LEGACY, effort="high")
    found = [e for e in check_agents() if "old-effort" in e.msg]
    assert [e.id for e in found] == ["agentrun.E021"]
    assert LEGACY in found[0].msg and "effort" in found[0].msg
    with pytest.raises(OptionRefused) as caught:
        start_run("old-effort", "hi")
    assert LEGACY in str(caught.value) and "effort" in str(caught.value)
    # A run's own override is checked the same way.
    agents("new-model")
    with pytest.raises(OptionRefused, match=f"{LEGACY}.*thinking.type 'adaptive'"):
        start_run("old-effort", "hi", options={"thinking": "adaptive", "effort": None})
    unregister_agent("old-effort")
    agents("forced", tools=[lookup()], tool_choice="any")
    with pytest.raises(OptionRefused, match=f"{CURRENT}.*tool_choice"):
        start_run("forced", "hi")


def test_refused_option__manage_py_check_fails(agents):
    agents("old-thinking", model=LEGACY, thinking="adaptive")
    with pytest.raises(Exception, match="agentrun.E021"):
        call_command("check", fail_level="ERROR")


# --------------------------------------------------------------------------- the API


def test_api__per_run_options_and_their_400s(messages_api, claude, agents, client):
    agents("api-opts", effort="high", client_options={"effort", "service_tier"})
    agents("api-old", model=LEGACY, client_options={"effort"})
    client.force_login(factories.user("ann"))
    url = reverse("agentrun:run-list")

    def post(body):
        return client.post(url, body, content_type="application/json")

    body = assert_api_error(
        post({"agent": "api-opts", "input": "x", "options": {"effort": "x"}}), 400, "invalid"
    )
    assert "effort must be one of" in body["errors"]["options"][0]
    body = assert_api_error(
        post({"agent": "api-opts", "input": "x", "options": {"top_k": 3}}), 400, "invalid"
    )
    assert "Unknown run option(s) top_k" in body["errors"]["options"][0]
    assert_api_error(post({"agent": "api-opts", "input": "x", "options": []}), 400, "invalid")
    body = assert_api_error(
        post({"agent": "api-old", "input": "x", "options": {"effort": "low"}}),
        400,
        "option_refused",
    )
    assert LEGACY in body["detail"] and "effort" in body["detail"]
    assert not Run.objects.exists()

    response = post(
        {
            "agent": "api-opts",
            "input": "x",
            "options": {"effort": "low"},
            "context": "It is Monday.",
        }
    )
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    assert run.context == "It is Monday."
    messages_api.script = lambda b: Reply("ok")
    drive(run, claude)
    assert messages_api.bodies[0]["output_config"] == {"effort": "low"}
    assert messages_api.bodies[0]["messages"][0]["content"][-1] == {
        "type": "text",
        "text": "It is Monday.",
    }


# --------------------------------------------------------------------------- structured output


def test_structured_output__parsed_into_the_run(messages_api, claude, agents, client):
    agents("typed", output_format=Answer)
    messages_api.script = lambda body: Reply(output={"city": "Lyon", "population": 522000})
    run = start_run("typed", "Biggest city near Grenoble?", owner=factories.user("bo"))
    drive(run, claude)
    accepted(messages_api)
    schema = messages_api.bodies[0]["output_config"]["format"]
    assert schema["type"] == "json_schema"
    assert schema["schema"]["additionalProperties"] is False
    assert run.state == "completed", run.error_message
    assert run.parsed_output == {"city": "Lyon", "population": 522000}
    assert Answer.model_validate(run.parsed_output).city == "Lyon"
    client.force_login(run.owner)
    shown = client.get(reverse("agentrun:run-detail", args=[run.pk])).json()
    assert shown["parsed_output"] == {"city": "Lyon", "population": 522000}
    completed = RunEvent.objects.get(run=run, type="run_completed").payload
    assert completed["parsed_output"] == run.parsed_output


def test_structured_output__a_json_schema_and_an_answer_that_does_not_validate(
    messages_api, claude, agents
):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    agents("counted", output_format=schema, max_tokens=64)
    # Cut off at max_tokens: the only way a constrained answer breaks its schema.
    messages_api.script = lambda body: Reply('{"n": 12', stop_reason="max_tokens")
    run = start_run("counted", "Count.")
    drive(run, claude)
    assert run.state == "failed"
    assert run.error_code == "invalid_structured_output"
    assert "not valid JSON (the answer was cut off at max_tokens)" in run.error_message
    assert run.parsed_output is None


def test_structured_output__stand_in_refuses_a_schema_the_api_refuses(messages_api, claude):
    from django_agentrun.abort import AbortSignal
    from django_agentrun.clients import ModelError, ModelRequest

    messages_api.script = lambda body: Reply("{}")
    request = ModelRequest(
        model=CURRENT,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=100,
        options={
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}
        },
    )
    with pytest.raises(ModelError, match="additionalProperties' must be explicitly set to false"):
        claude.create(request, abort=AbortSignal())


# --------------------------------------------------------------------------- per-turn context


def test_context__hook_appended_as_a_message_and_the_thinking_prefix_holds(
    messages_api, claude, agents
):
    days = iter(["Today is Monday.", "Today is Tuesday."])
    agents(
        "dated",
        system="Be brief.",
        tools=[lookup()],
        thinking="adaptive",
        context=lambda: next(days),
    )
    messages_api.script = by_message(
        {
            "Order 42?": [
                Reply(
                    [
                        {"type": "thinking", "thinking": "Look it up."},
                        tool_use("lookup", {"query": "42"}),
                    ]
                ),
                Reply([{"type": "thinking", "thinking": "Shipped."}, text("Shipped.")]),
            ],
            "And 43?": [Reply([{"type": "redacted_thinking", "data": "x"}, text("Shipped too.")])],
        }
    )
    conversation = start_conversation("dated")
    first = send_message(conversation, "Order 42?")
    drive(first, claude)
    later = send_message(conversation, "And 43?")
    drive(later, claude)
    accepted(messages_api)  # every thinking block came back under the same prefix
    assert later.state == "completed"
    assert {r["body"]["system"][0]["text"] for r in messages_api.requests} == {"Be brief."}
    last = messages_api.bodies[-1]["messages"]
    assert last[0]["content"][-1] == {"type": "text", "text": "Today is Monday."}
    assert last[-1]["content"][-1] == {"type": "text", "text": "Today is Tuesday."}
    assert (first.context, later.context) == ("Today is Monday.", "Today is Tuesday.")


def test_context__start_run_argument(messages_api, claude, agents):
    agents("ctx", thinking="adaptive")
    messages_api.script = lambda body: Reply("ok")
    run = start_run("ctx", "hi", context="Mode: expert.")
    drive(run, claude)
    assert messages_api.bodies[0]["messages"][0]["content"] == [
        {"type": "text", "text": "hi"},
        {"type": "text", "text": "Mode: expert."},
    ]
    assert "Mode" not in str(messages_api.bodies[0].get("system", ""))


# --------------------------------------------------------------------------- thinking shown


def test_thinking__shown_apart_from_the_answer_redacted_never_shown(
    messages_api, claude, agents, client, admin_client
):
    agents("thinker", thinking="adaptive", thinking_display="summarized")
    messages_api.script = lambda body: Reply(
        [
            {"type": "thinking", "thinking": "The user wants a greeting."},
            {"type": "redacted_thinking", "data": "SECRET-REASONING"},
            text("Hello!"),
        ]
    )
    run = start_run("thinker", "hi", owner=factories.user("tess"))
    drive(run, claude)
    stored = run.turns.get().content
    assert [b["type"] for b in stored] == ["thinking", "redacted_thinking", "text"]
    secret_data, signature = stored[1]["data"], stored[0]["signature"]
    # Thinking tokens are output tokens: counted in the run's usage (and so its budgets).
    response = RunEvent.objects.get(run=run, type="model_response").payload
    assert 0 < response["thinking_tokens"] <= response["usage"]["output_tokens"]
    assert run.output_tokens == response["usage"]["output_tokens"]

    client.force_login(run.owner)
    shown = client.get(reverse("agentrun:run-detail", args=[run.pk])).json()
    turn = shown["turns"][0]
    assert turn["thinking"] == "The user wants a greeting."
    assert turn["text"] == "Hello!"
    assert turn["content"][1] == {"type": "redacted_thinking"}
    events = client.get(reverse("agentrun:run-events", args=[run.pk])).json()
    for body in (shown, events):
        assert secret_data not in str(body) and signature not in str(body)

    page = admin_client.get(reverse("admin:agentrun_run_change", args=[run.pk])).content.decode()
    assert "The user wants a greeting." in page and "agentrun-thinking" in page
    assert "[redacted thinking]" in page
    assert secret_data not in page and signature not in page


# --------------------------------------------------------------------------- stop reasons


def test_refusal__category_and_the_model_that_answered(messages_api, claude, agents, client):
    agents("careful", model="claude-opus-5-5", output_format=Answer)
    messages_api.script = lambda body: Reply(
        [text("I can't help with that.")],
        stop_reason="refusal",
        stop_details={"category": "cyber", "explanation": "Exploit development."},
        model=CURRENT,  # the API fell back to another model
    )
    run = start_run("careful", "Write malware.", owner=factories.user("rex"))
    drive(run, claude)
    assert run.state == "completed" and run.stop_reason == "refusal"
    assert run.output["refusal"] == {
        "model": CURRENT,
        "category": "cyber",
        "explanation": "Exploit development.",
        "billed": True,  # mid-stream: it had streamed text
        "left_out_of_history": True,
    }
    assert run.parsed_output is None  # a refusal is no structured answer, and no failure
    assert run.turns.get().model == CURRENT
    client.force_login(run.owner)
    shown = client.get(reverse("agentrun:run-detail", args=[run.pk])).json()
    assert shown["output"]["refusal"]["category"] == "cyber"


def test_max_tokens__completes_with_it_unless_the_agent_continues(messages_api, claude, agents):
    agents("short", max_tokens=16)
    messages_api.script = lambda body: Reply("Part one, ", stop_reason="max_tokens")
    run = start_run("short", "Tell me.")
    drive(run, claude)
    assert (run.state, run.stop_reason) == ("completed", "max_tokens")
    assert len(messages_api.requests) == 1


def test_max_tokens__continued_in_the_next_turn(messages_api, claude, agents):
    agents("long", max_tokens=16, continue_on_max_tokens=True, thinking="adaptive")
    messages_api.script = by_message(
        {
            "Tell me.": [
                Reply(
                    [{"type": "thinking", "thinking": "Long."}, text("Part one, ")],
                    stop_reason="max_tokens",
                ),
                Reply("part two, ", stop_reason="max_tokens"),
                Reply("part three."),
            ]
        }
    )
    run = start_run("long", "Tell me.")
    drive(run, claude)
    accepted(messages_api)
    assert (run.state, run.stop_reason) == ("completed", "end_turn")
    assert run.output["text"] == "Part one, part two, part three."
    last = messages_api.bodies[-1]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]
    assert last[2]["content"] == CONTINUE_NOTICE
    # The projection from events alone rebuilds the history that was sent.
    events = RunEvent.objects.filter(run=run).order_by("seq")
    assert project(events).messages[:5] == last


def test_context_window_exceeded__fails_with_its_code(messages_api, claude, agents):
    agents("full")
    messages_api.script = lambda body: Reply("Partial", stop_reason="model_context_window_exceeded")
    run = start_run("full", "hi")
    drive(run, claude)
    assert (run.state, run.error_code) == ("failed", "context_window_exceeded")


# --------------------------------------------------------------------------- durability


def test_crash_after_the_answer__replayed_not_requested_again(
    monkeypatch, messages_api, claude, agents
):
    agents("durable", tools=[lookup()], thinking="adaptive", output_format=Answer, effort="low")
    replies = [
        Reply([{"type": "thinking", "thinking": "Look."}, tool_use("lookup", {"query": "Nice"})]),
        Reply(
            [{"type": "thinking", "thinking": "Easy."}, text('{"city": "Nice", "population": 1}')]
        ),
    ]
    messages_api.script = lambda body: replies[step_of(body)]
    run = start_run("durable", "hi")
    monkeypatch.setenv("AGENTRUN_FAILPOINTS", "model.after_commit=raise")
    with pytest.raises(FailpointError):
        advance(run.pk, client=claude)
    monkeypatch.delenv("AGENTRUN_FAILPOINTS")
    expire(run, owner=ELSEWHERE, ago=timedelta(minutes=5))
    drive(run, claude)
    accepted(messages_api)  # the thinking block went back unchanged after the crash
    assert messages_api.steps() == {0: 1, 1: 1}  # recorded once, replayed, never re-asked
    assert run.state == "completed", run.error_message
    assert run.parsed_output == {"city": "Nice", "population": 1}
    responses = RunEvent.objects.filter(run=run, type="model_response")
    assert run.output_tokens == sum(e.payload["usage"]["output_tokens"] for e in responses)
