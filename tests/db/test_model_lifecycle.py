"""Models retire on published dates (issue #36): a retired model is refused at `manage.py
check` and before a run starts (a 400 naming the replacement), and by the Messages API
stand-in; a deprecated one warns with its retirement date; the table's entries carry the
lifecycle, and AGENTRUN_MODELS may set it."""

from __future__ import annotations

from datetime import date

import pytest
from django.core.management import call_command
from django.urls import reverse
from rest_framework.test import APIClient

from django_agentrun import Agent, start_run
from django_agentrun.agents import unregister_agent
from django_agentrun.catalog import model_info, refusals
from django_agentrun.exceptions import OptionRefused
from django_agentrun.model_checks import agent_messages
from django_agentrun.testing.messages_api import APIRequestError, validate_request
from tests import factories

pytestmark = [pytest.mark.django_db]

SONNET_4_5 = "claude-sonnet-4-5"


@pytest.fixture
def agent():
    names = []

    def define(name, model):
        names.append(name)
        return Agent(name, model=model, system="Be brief.")

    yield define
    for name in names:
        unregister_agent(name)


def test_table__sonnet_4_5_retired_opus_4_5_deprecated():
    sonnet = model_info(SONNET_4_5)
    assert sonnet.lifecycle() == "retired" and sonnet.deprecated == date(2026, 11, 30)
    assert sonnet.replacement == "claude-sonnet-5-5"
    assert model_info("claude-sonnet-4-5-20250929").lifecycle() == "retired"  # the dated id
    opus = model_info("claude-opus-4-5")
    assert opus.lifecycle(date(2026, 12, 7)) == "deprecated"
    assert opus.lifecycle(date(2027, 1, 22)) == "retired"  # from its retirement date
    assert model_info("claude-sonnet-5-5").lifecycle() == "current"


def test_retired__refused_at_check_naming_the_replacement(agent):
    messages = agent_messages(agent("old-sonnet", SONNET_4_5))
    assert [m.id for m in messages] == ["agentrun.E021"]
    assert "retired on 2026-11-30" in messages[0].msg and "claude-sonnet-5-5" in messages[0].msg


def test_retired__refused_before_a_run_starts_and_by_the_api(agent):
    agent("old-sonnet-run", SONNET_4_5)
    with pytest.raises(OptionRefused, match="claude-sonnet-5-5"):
        start_run("old-sonnet-run", "Hello.")
    client = APIClient()
    client.force_authenticate(factories.user("ines", "start_run"))
    response = client.post(
        reverse("agentrun:run-list"), {"agent": "old-sonnet-run", "input": "Hi"}, format="json"
    )
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "option_refused" and "claude-sonnet-5-5" in body["detail"]
    # The stand-in refuses a request to it as well.
    with pytest.raises(APIRequestError, match="retired"):
        validate_request(
            {
                "model": SONNET_4_5,
                "max_tokens": 16,
                "messages": [{"role": "user", "content": "Hi"}],
            }
        )


def test_deprecated__warns_with_its_date(agent):
    messages = agent_messages(agent("old-opus", "claude-opus-4-5"))
    assert [m.id for m in messages] == ["agentrun.W022"]
    assert "2027-01-22" in messages[0].msg and "claude-opus-5-5" in messages[0].msg
    assert refusals("claude-opus-4-5", {"max_tokens": 16}) == []  # it still answers


def test_overrides__a_host_sets_the_lifecycle(settings):
    settings.AGENTRUN_MODELS = {
        "claude-sonnet-4-6": {"deprecated": "2026-12-01", "replacement": "claude-sonnet-5-5"},
        "claude-new": {"like": "claude-sonnet-5-5"},
    }
    assert model_info("claude-sonnet-4-6").lifecycle() == "retired"
    assert model_info("claude-new").lifecycle() == "current"
    settings.AGENTRUN_MODELS = {"claude-sonnet-4-6": {"deprecated": "soon"}}
    with pytest.raises(Exception, match="expected a date"):
        model_info("claude-sonnet-4-6")


def test_models_command__shows_the_lifecycle(capsys):
    call_command("agentrun_models", "list")
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith(SONNET_4_5 + " "))
    assert "retired" in line
    assert "retired 2026-11-30, use claude-sonnet-5-5" in out
