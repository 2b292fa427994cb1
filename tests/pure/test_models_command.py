"""manage.py agentrun_models: the listing, and `refresh` from the Models API through the
real SDK against the stand-in (which answers GET /v1/models from the shipped table)."""

from __future__ import annotations

import json
import os
from io import StringIO

import anthropic
import pytest
from django.core.management import CommandError, call_command

from django_agentrun.catalog import SHIPPED, model_info, refusals, shipped_info
from django_agentrun.testing.messages_api import MessagesAPIServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def api():
    with MessagesAPIServer() as server:
        yield server


def run(*args: str) -> str:
    out = StringIO()
    call_command("agentrun_models", *args, stdout=out)
    return out.getvalue()


def test_stand_in__answers_the_models_api_from_the_shipped_table(api):
    with anthropic.Anthropic(base_url=api.base_url, api_key="k", max_retries=0) as client:
        listed = list(client.models.list(limit=5))  # pages through all of them
        one = client.models.retrieve("claude-haiku-5-5")
        with pytest.raises(anthropic.NotFoundError):
            client.models.retrieve("claude-nothing-1")
        with pytest.raises(anthropic.BadRequestError):
            client.models.list(limit=0)
    assert [m.id for m in listed] == list(dict.fromkeys(i.id for i in SHIPPED.values()))
    assert (one.max_input_tokens, one.max_tokens, one.line) == (1_000_000, 128_000, "haiku")
    assert one.capabilities.effort.xhigh.supported
    assert not one.capabilities.thinking.types.enabled.supported
    # The SDK sends its anthropic-version: the stand-in refuses a request without one.
    assert all(r["headers"].get("anthropic-version") for r in api.requests)


def test_refresh__stores_the_models_apis_capabilities_where_workers_read_them(
    api, settings, tmp_path
):
    settings.AGENTRUN_MODELS_FILE = str(tmp_path / "models.json")
    settings.AGENTRUN_MODELS_FILE_CHECK_SECONDS = 0  # look at the file at every lookup
    out = run("refresh", "--api-key", "k", "--base-url", api.base_url)
    assert "Refreshed 19 models" in out
    stored = json.loads((tmp_path / "models.json").read_text())
    sonnet = stored["models"]["claude-sonnet-5-5"]
    assert sonnet["context_window"] == 1_000_000
    assert sonnet["thinking"] == ["adaptive", "between_tools"]  # disabled: a 400 on 5.5
    assert sonnet["effort"] == ["low", "medium", "high", "xhigh", "max"]
    assert stored["models"]["claude-haiku-4-5"]["thinking"] == ["disabled", "enabled"]
    # Read as the table: the same as shipped, since the stand-in serves the shipped table.
    for model in ("claude-sonnet-5-5", "claude-haiku-4-5", "claude-opus-4-6"):
        assert model_info(model) == shipped_info(model)
    # A later refresh that says otherwise (the file as the API would leave it) is what
    # every process sees from then on, without a restart.
    sonnet["thinking"] = ["adaptive"]
    sonnet["effort"] = ["low", "medium", "high"]
    (tmp_path / "models.json").write_text(json.dumps(stored))
    os.utime(tmp_path / "models.json", ns=(1, 1))  # a new mtime, whatever the clock's grain
    assert refusals("claude-sonnet-5-5", {"output_config": {"effort": "max"}}) == [
        "claude-sonnet-5-5 does not accept output_config.effort 'max' (accepts: low, medium, high)"
    ]
    assert refusals("claude-sonnet-5-5", {"thinking": {"type": "disabled"}})
    assert model_info("claude-sonnet-5-5").prices == shipped_info("claude-sonnet-5-5").prices
    # AGENTRUN_MODELS still has the last word.
    settings.AGENTRUN_MODELS = {"claude-sonnet-5-5": {"effort": ["low", "max"]}}
    assert refusals("claude-sonnet-5-5", {"output_config": {"effort": "max"}}) == []


def test_refresh__offline_uses_the_shipped_table(settings, tmp_path, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    settings.AGENTRUN_MODELS_FILE = str(tmp_path / "models.json")
    assert "the shipped table (with AGENTRUN_MODELS) is used" in run("refresh")
    assert not (tmp_path / "models.json").exists()
    assert model_info("claude-opus-5-5") == shipped_info("claude-opus-5-5")


def test_refresh__a_refused_key_is_a_clear_error_and_keeps_the_file(settings, tmp_path):
    settings.AGENTRUN_MODELS_FILE = str(tmp_path / "models.json")
    (tmp_path / "models.json").write_text('{"models": {}}')
    with MessagesAPIServer(api_key="right") as server:
        with pytest.raises(CommandError, match="The Models API refused the request"):
            run("refresh", "--api-key", "wrong", "--base-url", server.base_url)
    assert (tmp_path / "models.json").read_text() == '{"models": {}}'
    settings.AGENTRUN_MODELS_FILE = None
    with pytest.raises(CommandError, match="AGENTRUN_MODELS_FILE is not set"):
        run("refresh", "--api-key", "k")


def test_list__the_table_with_overrides(settings):
    settings.AGENTRUN_MODELS = {"house-haiku": {"like": "claude-haiku-5-5"}}
    out = run()
    assert "claude-haiku-5-5" in out and "prompt > 100000" in out and "house-haiku" in out
    listed = json.loads(run("--json"))
    opus = next(m for m in listed if m["id"] == "claude-opus-5-5")
    assert opus["prices"]["cache_read"] == "0.20" and opus["forced_tool_choice"] is False
    settings.AGENTRUN_MODELS = {"claude-opus-5-5": {"prices": {"input": "x"}}}
    with pytest.raises(CommandError, match="expected a number"):
        run()


def test_refresh__a_broken_file_never_fails_a_turn_and_check_says_so(settings, tmp_path, caplog):
    from django_agentrun.checks import check_agents

    settings.AGENTRUN_MODELS_FILE = str(tmp_path / "models.json")
    (tmp_path / "models.json").write_text('{"models": {"claude-opus-5-5": {"effort": ["huge"]}}')
    # Cut short by hand: the turn's pricing still works from the shipped table...
    assert model_info("claude-opus-5-5") == shipped_info("claude-opus-5-5")
    assert "cannot be read" in caplog.text
    # ...and manage.py check names the file.
    (error,) = check_agents()
    assert error.id == "agentrun.E020" and "AGENTRUN_MODELS_FILE" in error.msg
    (tmp_path / "models.json").write_text('{"models": {"claude-opus-5-5": {"effort": ["huge"]}}}')
    os.utime(tmp_path / "models.json", ns=(2, 2))
    assert model_info("claude-opus-5-5") == shipped_info("claude-opus-5-5")
    (error,) = check_agents()
    assert "effort: unknown value(s) ['huge']" in error.msg
