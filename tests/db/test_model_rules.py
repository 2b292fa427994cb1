"""The model rules (catalog.RULES) applied before a run is queued: manage.py check for an
Agent, start_run and POST /runs/, a fork, and a conversation message, each a 400
`option_refused` naming the option, the value and the model (never a provider 400 on
turn 1); a conversation's options never change with a message."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from django_agentrun import fork_run, resume_run, send_message, start_conversation, start_run
from django_agentrun.agents import Agent, unregister_agent
from django_agentrun.checks import check_agents
from django_agentrun.exceptions import OptionRefused
from django_agentrun.models import Conversation, Run, RunEvent
from django_agentrun.testing import drive
from django_agentrun.testing.messages_api import Reply, by_step, text
from tests import factories
from tests.conftest import assert_api_error

# What the run asks the model (the request's rules), not how its rows are stored: the same on
# any Postgres driver and binding (the store's statements run in the other modules).
pytestmark = [pytest.mark.django_db, pytest.mark.one_driver]

SONNET = "claude-sonnet-5-5"
# What Sonnet 5.5 refuses (What's new in Claude Sonnet 5.5): between_tools above high.
REFUSED = {"thinking": {"type": "between_tools"}, "output_config": {"effort": "max"}}


@pytest.fixture
def owner(db) -> User:
    return factories.user("dana")


@pytest.fixture
def between_tools():
    # Clients may set effort (the author's control): what is refused here is the model's.
    agent = Agent(name="between", model=SONNET, thinking="between_tools", client_options={"effort"})
    yield agent
    unregister_agent("between")


def assert_names_it(detail: str) -> None:
    assert SONNET in detail and "'between_tools'" in detail and "'max'" in detail, detail


def test_check__an_agent_whose_combination_the_model_refuses(between_tools):
    Agent(name="between-max", model=SONNET, thinking="between_tools", effort="max")
    try:
        found = [m for m in check_agents() if "between-max" in m.msg]
        assert [m.id for m in found] == ["agentrun.E021"]
        assert_names_it(found[0].msg)
    finally:
        unregister_agent("between-max")
    assert not [m for m in check_agents() if "'between'" in m.msg]


def test_start_run__a_run_option_the_model_refuses_with_the_agents(between_tools, owner):
    with pytest.raises(OptionRefused) as caught:
        start_run("between", "hi", options={"effort": "max"})
    assert_names_it(str(caught.value))
    start_run("between", "hi", options={"effort": "low"})  # accepted: at low
    client = Client()
    client.force_login(owner)
    body = assert_api_error(
        client.post(
            reverse("agentrun:run-list"),
            {"agent": "between", "input": "x", "options": {"effort": "max"}},
            content_type="application/json",
        ),
        400,
        "option_refused",
    )
    assert_names_it(body["detail"])
    assert Run.objects.count() == 1


def refused_snapshot(config: dict) -> dict:
    """A snapshot written before the rule was known (an older release, a changed table)."""
    return {**config, "model": SONNET, "options": dict(REFUSED)}


def test_send_message__a_conversation_whose_snapshot_the_model_refuses(owner):
    conversation = start_conversation("chat", owner=owner)
    Conversation.objects.filter(pk=conversation.pk).update(
        config=refused_snapshot(conversation.config)
    )
    with pytest.raises(OptionRefused) as caught:
        send_message(conversation, "Hello.")
    assert_names_it(str(caught.value))
    client = Client()
    client.force_login(owner)
    body = assert_api_error(
        client.post(
            reverse("agentrun:conversation-messages", args=[conversation.pk]),
            {"input": "Hello."},
            content_type="application/json",
        ),
        400,
        "option_refused",
    )
    assert_names_it(body["detail"])
    assert not conversation.runs.exists()


def test_conversation__a_message_cannot_change_its_options(owner):
    conversation = start_conversation("chat", owner=owner)
    client = Client()
    client.force_login(owner)
    body = assert_api_error(
        client.post(
            reverse("agentrun:conversation-messages", args=[conversation.pk]),
            {"input": "Hello.", "options": {"effort": "low"}},
            content_type="application/json",
        ),
        400,
        "invalid",
    )
    assert "options" in body["errors"] and "effort" in body["errors"]["options"][0]
    assert not conversation.runs.exists()
    with pytest.raises(TypeError):
        send_message(conversation, "Hello.", options={"effort": "low"})  # type: ignore[call-arg]


def test_fork__a_run_whose_snapshot_the_model_refuses(owner):
    run, _ = factories.conversation(owner=owner)
    Run.objects.filter(pk=run.pk).update(config=refused_snapshot(run.config))
    with pytest.raises(OptionRefused) as caught:
        fork_run(run, at_turn=0)
    assert_names_it(str(caught.value))
    client = Client()
    client.force_login(owner)
    body = assert_api_error(
        client.post(
            reverse("agentrun:run-fork", args=[run.pk]),
            {"turn": 0},
            content_type="application/json",
        ),
        400,
        "option_refused",
    )
    assert_names_it(body["detail"])
    assert Run.objects.count() == 1


def test_resume__a_run_whose_snapshot_the_model_refuses(owner):
    run = factories.failed_run(owner=owner)
    Run.objects.filter(pk=run.pk).update(config=refused_snapshot(run.config))
    with pytest.raises(OptionRefused) as caught:
        resume_run(run)
    assert_names_it(str(caught.value))
    run.refresh_from_db()
    assert run.state == "failed"


def test_cost__a_us_only_answer_costs_1_1x_through_the_sdk(agentrun_messages_api):
    """usage.inference_geo "us" (the request asked, or the workspace's default) is read
    from the SDK's Usage and priced at 1.1x (Data residency, Claude Platform on AWS)."""
    Agent(name="us-only", model=SONNET)
    usage = {"input_tokens": 1_000_000, "output_tokens": 100_000}
    try:
        agentrun_messages_api.script = by_step(
            [Reply([text("Done.")], usage={**usage, "inference_geo": "us"})]
        )
        run = drive(start_run("us-only", "Hi."))
    finally:
        unregister_agent("us-only")
    assert run.state == "completed", run.error_message
    assert run.cost_usd == Decimal("3.3")  # ($2 input + $1 output) x 1.1
    event = RunEvent.objects.get(run=run, type="model_response")
    assert event.payload["usage"]["inference_geo"] == "us"
    assert run.turns.get().usage_details["inference_geo"] == "us"
