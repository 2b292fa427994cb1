"""A stream that ends cleanly before `message_stop` (a proxy or gateway closed it) is an
incomplete response: retried within the bounded backoff, never recorded or executed.
Through the real SDK against the stand-in, which ends such a body with a clean last chunk."""

from __future__ import annotations

import pytest

from django_agentrun import start_run
from django_agentrun.abort import AbortSignal
from django_agentrun.clients import ModelError, ModelRequest
from django_agentrun.clients.anthropic import AnthropicModelClient
from django_agentrun.models import ToolCall, Turn
from django_agentrun.testing.messages_api import MessagesAPIServer, Reply, step_of, text, tool_use
from tests.conftest import drive
from tests.testapp.agents import executions

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(20)]

FULL = {"query": "order 12345 of Ann"}


@pytest.fixture(autouse=True)
def _fast_retries(settings, tmp_path, monkeypatch):
    settings.AGENTRUN_MODEL_RETRY_BASE_SECONDS = 0.01
    settings.AGENTRUN_MODEL_RETRY_MAX_SECONDS = 0.02
    monkeypatch.setenv("AGENTRUN_TEST_LOG", str(tmp_path / "executions.jsonl"))


def cut_first(reply_for_step, end_after, cuts=1):
    """A script whose first `cuts` answers to step 0 end early; the rest are complete."""
    sent = {"n": 0}

    def script(body):
        reply = reply_for_step(step_of(body))
        if step_of(body) == 0 and sent["n"] < cuts:
            sent["n"] += 1
            return Reply(reply.content, chunk_size=4, end_after=end_after)
        return reply

    return script


def tool_then_text(step):
    if step == 0:
        return Reply([tool_use("lookup", FULL, id="toolu_look")], chunk_size=4)
    return Reply([text("Found it.")])


@pytest.fixture
def client_for():
    made = []

    def make(api):
        made.append(AnthropicModelClient(base_url=api.base_url, api_key="test-key"))
        return made[-1]

    yield make
    for client in made:
        client.close()


def test_client__a_body_ended_before_message_stop_is_a_retryable_error(client_for):
    # message_start, ping, block start, the empty partial_json, then 3 chunks of input: the
    # SDK's snapshot holds {"query": "ord"}-like partial arguments and no stop reason.
    with MessagesAPIServer(cut_first(tool_then_text, end_after=7, cuts=9)) as api:
        request = ModelRequest(
            model="claude-sonnet-4-6", messages=[{"role": "user", "content": "x"}], max_tokens=100
        )
        with pytest.raises(ModelError) as caught:
            client_for(api).create(request, abort=AbortSignal())
    assert caught.value.retryable
    assert "no stop reason" in str(caught.value)


def test_engine__partial_tool_use_is_never_executed_the_complete_answer_is(client_for):
    with MessagesAPIServer(cut_first(tool_then_text, end_after=7)) as api:
        run = start_run("test-agent", "Where is Ann's order?")
        drive(run, client_for(api))
        assert api.steps() == {0: 2, 1: 1}
    assert run.state == "completed", (run.error_code, run.error_message)
    rows = executions("lookup")
    assert [r["query"] for r in rows] == [FULL["query"]]
    call = ToolCall.objects.get(run=run)
    assert call.arguments == FULL
    assert Turn.objects.get(run=run, index=0).model_attempts == 2
    assert run.turn_count == 2  # usage of the cut response is not counted


def test_engine__truncated_text_is_never_recorded_as_the_answer(client_for):
    answer = "The order shipped on Monday and arrives on Thursday."

    def script_step(step):
        return Reply([text(answer)], chunk_size=5)

    with MessagesAPIServer(cut_first(script_step, end_after=5)) as api:
        run = start_run("test-agent", "When does it arrive?")
        drive(run, client_for(api))
    assert run.state == "completed"
    assert run.output["text"] == answer
    assert run.stop_reason == "end_turn"


def test_engine__always_cut_short__fails_after_the_bounded_retries_nothing_run(
    settings, client_for
):
    settings.AGENTRUN_MODEL_RETRIES = 2
    with MessagesAPIServer(cut_first(tool_then_text, end_after=7, cuts=99)) as api:
        run = start_run("test-agent", "Where is Ann's order?")
        drive(run, client_for(api))
        assert api.steps() == {0: 3}
    assert run.state == "failed"
    assert run.error_code == "model_unavailable"
    assert not executions("lookup")
    assert not ToolCall.objects.filter(run=run).exists()
