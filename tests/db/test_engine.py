"""The engine in-process with a scripted model (SQLite): bad model output, tool errors, every
stop reason, replay, model errors and retries. Every request the engine sends is checked
against the fake Messages API's validator (the real API's rules for tool_use/tool_result)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from django_agentrun import start_run, wakeups
from django_agentrun.clients import ModelError
from django_agentrun.engine import Outcome, advance
from django_agentrun.models import Run, RunEvent
from django_agentrun.testing import Reply, ScriptedClient, error, reply, text, tool_use
from django_agentrun.testing.messages_api import validate_request
from tests.conftest import assert_projection_matches, drive
from tests.testapp.agents import executions

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _log(test_log):
    """Every test here logs the test tools' executions to a file of its own."""


def body_of(request):
    body = {
        "model": request.model,
        "max_tokens": request.max_tokens,
        "messages": request.messages,
    }
    if request.system:
        body["system"] = request.system
    if request.tools:
        body["tools"] = request.tools
    if request.tool_choice:
        body["tool_choice"] = request.tool_choice
    return json.loads(json.dumps(body))


def assert_requests_valid(client):
    for request in client.requests:
        validate_request(body_of(request))


def results_sent(client, step):
    """The tool_result blocks of the last user message of the request for `step`."""
    request = next(r for r in client.requests if _step(r) == step)
    last = request.messages[-1]
    assert last["role"] == "user"
    return [b for b in last["content"] if b.get("type") == "tool_result"]


def _step(request):
    return sum(1 for m in request.messages if m["role"] == "assistant")


def run_with(script, input="hello", agent="test-agent"):
    client = ScriptedClient(script)
    run = start_run(agent, input)
    outcomes = drive(run, client)
    return run, client, outcomes


# --------------------------------------------------------------------------- bad model output


def test_bad_output__unknown_tool_is_an_error_result_and_the_run_goes_on():
    run, client, _ = run_with(
        [reply(tool_use("teleport", {"to": "mars"}, id="toolu_unknown")), reply(text("Sorry."))]
    )
    assert run.state == "completed", (run.error_code, run.error_message)
    call = run.tool_calls.get()
    assert (call.state, call.is_error, call.result_source) == ("errored", True, "synthetic")
    assert "Unknown tool 'teleport'" in call.result
    assert "lookup" in call.result  # it names the tools that exist
    assert call.attempt == 0 and call.started_at is None  # never started
    (result,) = results_sent(client, 1)
    assert result == {
        "type": "tool_result",
        "tool_use_id": "toolu_unknown",
        "content": call.result,
        "is_error": True,
    }
    assert run.output["text"] == "Sorry."
    assert_requests_valid(client)
    assert_projection_matches(run)


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"query": 5}, "query: Input should be a valid string"),
        ({}, "query: Field required"),
        ({"query": "x", "limit": 3}, "limit: Extra inputs are not permitted"),
        ({"query": ["a"]}, "query: Input should be a valid string"),
    ],
    ids=["wrong-type", "missing-field", "extra-field", "list-for-str"],
)
def test_bad_output__invalid_arguments_never_reach_the_handler(arguments, expected):
    run, client, _ = run_with(
        [reply(tool_use("lookup", arguments, id="toolu_bad")), reply(text("Fixed nothing."))]
    )
    assert run.state == "completed"
    call = run.tool_calls.get()
    assert (call.state, call.is_error, call.result_source) == ("errored", True, "synthetic")
    assert "Invalid arguments for tool lookup" in call.result
    assert expected in call.result
    assert "fix the arguments" in call.result
    assert executions("lookup") == []
    (result,) = results_sent(client, 1)
    assert result["is_error"] is True and result["tool_use_id"] == "toolu_bad"
    assert_requests_valid(client)
    assert_projection_matches(run)


def test_bad_output__valid_and_invalid_calls_in_one_turn_keep_their_order():
    run, client, _ = run_with(
        [
            reply(
                tool_use("lookup", {"query": "ok"}, id="toolu_a"),
                tool_use("lookup", {"query": 1}, id="toolu_b"),
                tool_use("nope", {}, id="toolu_c"),
                tool_use("lookup", {"query": "ok2"}, id="toolu_d"),
            ),
            reply(text("done")),
        ]
    )
    assert run.state == "completed"
    results = results_sent(client, 1)
    assert [r["tool_use_id"] for r in results] == ["toolu_a", "toolu_b", "toolu_c", "toolu_d"]
    assert [bool(r.get("is_error")) for r in results] == [False, True, True, False]
    assert [e["query"] for e in executions("lookup")] == ["ok", "ok2"]
    assert_requests_valid(client)
    assert_projection_matches(run)


def test_bad_output__truncated_tool_use_at_max_tokens_is_not_run():
    run, client, _ = run_with(
        [
            reply(
                text("Let me save a long note."),
                tool_use("save_note", {"text": "partial"}, id="toolu_cut"),
                stop_reason="max_tokens",
            ),
            reply(text("I will keep it short.")),
        ]
    )
    assert run.state == "completed", (run.error_code, run.error_message)
    assert run.stop_reason == "end_turn"
    call = run.tool_calls.get()
    assert (call.state, call.is_error) == ("errored", True)
    assert "cut off by the max_tokens limit" in call.result
    assert executions("save_note") == []
    turn0 = run.turns.get(index=0)
    assert turn0.stop_reason == "max_tokens"
    (result,) = results_sent(client, 1)
    assert result["tool_use_id"] == "toolu_cut" and result["is_error"] is True
    assert_requests_valid(client)
    assert_projection_matches(run)


def test_bad_output__only_the_last_tool_use_counts_as_truncated():
    run, client, _ = run_with(
        [
            reply(
                tool_use("lookup", {"query": "whole"}, id="toolu_whole"),
                tool_use("lookup", {"query": "cut"}, id="toolu_cut"),
                stop_reason="max_tokens",
            ),
            reply(text("ok")),
        ]
    )
    assert run.state == "completed"
    whole = run.tool_calls.get(tool_call_id="toolu_whole")
    cut = run.tool_calls.get(tool_call_id="toolu_cut")
    assert whole.state == "succeeded"
    assert cut.state == "errored" and "max_tokens" in cut.result
    assert [e["query"] for e in executions("lookup")] == ["whole"]
    assert_requests_valid(client)
    assert_projection_matches(run)


def test_bad_output__tool_use_input_not_an_object_is_sanitized():
    block = {"type": "tool_use", "id": "toolu_str", "name": "lookup", "input": '{"query": "x'}
    run, client, _ = run_with([reply(block), reply(text("ok"))])
    assert run.state == "completed"
    call = run.tool_calls.get()
    assert call.state == "errored" and "query: Field required" in call.result
    # The history sent back carries an object, as the API requires.
    assistant = client.requests[1].messages[1]
    assert assistant["content"][0]["input"] == {}
    assert executions("lookup") == []
    assert_requests_valid(client)
    assert_projection_matches(run)


def test_bad_output__duplicate_tool_use_ids_end_the_run():
    """Regression (fixed in 5a4fdb9): repeated ids used to crash on the unique key, forever."""
    client = ScriptedClient(
        [
            reply(
                tool_use("lookup", {"query": "a"}, id="toolu_same"),
                tool_use("lookup", {"query": "b"}, id="toolu_same"),
            ),
            reply(text("ok")),
        ]
    )
    run = start_run("test-agent", "hello")
    outcomes = []
    for _ in range(3):
        try:
            outcomes.append(advance(run.pk, client=client))
        except Exception as exc:  # noqa: BLE001 - the old bug: the step crashed
            outcomes.append(type(exc).__name__)
        run.refresh_from_db()
        if not run.is_active:
            break
    assert run.state in ("failed", "completed"), (run.state, outcomes)
    assert (run.state, run.error_code, run.failure_phase) == (
        "failed",
        "invalid_model_output",
        "model",
    )
    assert run.output_tokens == 10  # the discarded response's usage is counted once
    assert len(client.requests) == 1  # the (paid) model call is not repeated
    assert executions("lookup") == []
    assert_projection_matches(run)


def test_bad_output__tool_use_id_reused_from_an_earlier_turn_is_not_executed():
    run, client, _ = run_with(
        [
            reply(tool_use("lookup", {"query": "first"}, id="toolu_reused")),
            reply(tool_use("lookup", {"query": "second"}, id="toolu_reused")),
            reply(text("done")),
        ]
    )
    assert [e["query"] for e in executions("lookup")] == ["first"]
    assert_requests_valid(client)  # every history the engine sent is one the API accepts
    assert run.state == "failed" and run.error_code == "invalid_model_output"
    assert_projection_matches(run)


def _whitespace_only_messages(request):
    """Messages whose text blocks are all whitespace-only: the real API answers 400
    'messages: text content blocks must contain non-whitespace text'."""
    bad = []
    for i, message in enumerate(request.messages):
        content = message["content"]
        if isinstance(content, str):
            texts = [content]
        else:
            texts = [b.get("text", "") for b in content if b.get("type") == "text"]
        if texts and not any(t.strip() for t in texts):
            bad.append(i)
    return bad


def test_bad_output__whitespace_only_text_is_not_sent_back():
    """Regression (fixed in 5a4fdb9): the real API rejects whitespace-only text messages."""
    answers = iter([reply(text("\n\n"), stop_reason="pause_turn")])

    def script(request):
        return next(answers, reply(text("done")))

    run, client, _ = run_with(script)
    assert run.state == "completed", (run.error_code, run.error_message)
    assert run.output["text"] == "done"
    assert len(client.requests) == 2
    assert [_whitespace_only_messages(r) for r in client.requests] == [[], []]
    assert_requests_valid(client)
    assert_projection_matches(run)


# --------------------------------------------------------------------------- tool errors


def test_tool_error__becomes_an_error_result_with_its_message():
    run, client, _ = run_with(
        [reply(tool_use("fail_always", {"reason": "disk full"}, id="toolu_f")), reply(text("ok"))]
    )
    assert run.state == "completed"
    call = run.tool_calls.get()
    assert (call.state, call.is_error, call.result_source) == ("errored", True, "executed")
    assert call.result == "failed on purpose: disk full"
    assert call.attempt == 1
    (result,) = results_sent(client, 1)
    assert result["content"] == "failed on purpose: disk full"
    assert_requests_valid(client)
    assert_projection_matches(run)


def test_tool_exception__secret_in_message_does_not_leak():
    run, client, _ = run_with([reply(tool_use("explode", {}, id="toolu_x")), reply(text("ok"))])
    assert run.state == "completed"
    call = run.tool_calls.get()
    assert (call.state, call.is_error) == ("errored", True)
    assert "secret-token-123" not in json.dumps(call.result)
    assert "RuntimeError" in call.result
    # Not in the events, not in anything sent to the model.
    payloads = json.dumps(list(RunEvent.objects.filter(run=run).values_list("payload", flat=True)))
    assert "secret-token-123" not in payloads
    assert all("secret-token-123" not in json.dumps(r.messages) for r in client.requests)
    assert_requests_valid(client)
    assert_projection_matches(run)


def test_idempotency_key__is_sha256_of_run_id_and_tool_call_id():
    run, client, _ = run_with(
        [
            reply(
                tool_use("lookup", {"query": "a"}, id="toolu_k1"),
                tool_use("save_note", {"text": "n"}, id="toolu_k2"),
            ),
            reply(text("ok")),
        ]
    )
    assert run.state == "completed"
    seen = {row["kind"]: row["key"] for row in executions()}
    for call in run.tool_calls.all():
        expected = hashlib.sha256(f"{run.pk}{call.tool_call_id}".encode()).hexdigest()
        assert call.idempotency_key == expected
        assert seen[call.name] == expected  # what ctx.idempotency_key handed the handler
    assert_projection_matches(run)


# --------------------------------------------------------------------------- stop reasons


@pytest.mark.parametrize("stop", ["end_turn", "stop_sequence", "max_tokens", "refusal"])
def test_stop_reason__without_tools_completes(stop):
    run, client, outcomes = run_with([reply(text(f"answer ({stop})"), stop_reason=stop)])
    assert outcomes == [Outcome.FINISHED]
    assert run.state == "completed"
    assert run.stop_reason == stop
    # A refused answer's partial output is discarded (the output is the refusal).
    assert run.output["text"] == ("" if stop == "refusal" else f"answer ({stop})")
    assert run.turns.get().stop_reason == stop
    assert len(client.requests) == 1
    assert_projection_matches(run)


def test_stop_reason__pause_turn_continues_with_the_paused_content():
    # A paused turn leaves its server tool use open: sent back last, it is no prefill.
    search = {"type": "server_tool_use", "id": "srvtoolu_paused", "name": "web_search"}
    paused = [text("Searching the web..."), {**search, "input": {"query": "otters"}}]
    run, client, outcomes = run_with(
        [reply(*paused, stop_reason="pause_turn"), reply(text("Found it."))], agent="researcher"
    )
    assert outcomes == [Outcome.FINISHED]  # one task goes on with the next turn itself
    assert run.state == "completed" and run.stop_reason == "end_turn"
    assert run.turns.count() == 2
    second = client.requests[1].messages
    assert second[-1] == {"role": "assistant", "content": paused}
    assert run.output["text"] == "Found it."
    assert run.turn_count == 2
    assert_requests_valid(client)
    assert_projection_matches(run)


def test_stop_reason__context_window_exceeded_fails():
    run, client, _ = run_with(
        [reply(text("I cannot"), stop_reason="model_context_window_exceeded")]
    )
    assert run.state == "failed"
    assert run.error_code == "context_window_exceeded"
    assert run.failure_phase == "model"
    # The response was recorded (its usage counted once).
    assert run.turn_count == 1
    assert run.output_tokens == 10
    assert_projection_matches(run)


def test_stop_reason__context_window_exceeded_with_a_tool_use_fails_and_runs_nothing():
    run, client, _ = run_with(
        [
            reply(
                tool_use("save_note", {"text": "x"}, id="toolu_ctx"),
                stop_reason="model_context_window_exceeded",
            )
        ]
    )
    assert run.state == "failed" and run.error_code == "context_window_exceeded"
    assert executions("save_note") == []
    assert run.tool_calls.get().is_closed
    assert_projection_matches(run)


@pytest.mark.parametrize(
    ("turns_per_task", "expected"),
    [
        (10, [Outcome.FINISHED]),
        (2, [Outcome.CONTINUED, Outcome.FINISHED]),
        (1, [Outcome.CONTINUED, Outcome.CONTINUED, Outcome.FINISHED]),
    ],
)
def test_stop_reason__tool_use_then_end_turn_over_three_turns(settings, turns_per_task, expected):
    """One task goes on with the run's next turn itself, up to AGENTRUN_TURNS_PER_TASK
    turns; then it hands the run back to the queue."""
    settings.AGENTRUN_TURNS_PER_TASK = turns_per_task
    run, client, outcomes = run_with(
        [
            reply(tool_use("lookup", {"query": "a"})),
            reply(tool_use("lookup", {"query": "b"})),
            reply(text("done")),
        ]
    )
    assert outcomes == expected
    assert run.state == "completed" and run.turn_count == 3
    assert client.steps() == {0: 1, 1: 1, 2: 1}
    assert_requests_valid(client)
    assert_projection_matches(run)


# --------------------------------------------------------------------------- projection


@pytest.mark.parametrize("point", ["tool.before_handler", "tool.after_commit"])
def test_projection__run_stopped_between_tool_calls_is_awaiting_tool(monkeypatch, point, settings):
    """Regression: running -> awaiting_tool carries run_state in its event (fixed in bb0c486).
    One call at a time (two lookups would otherwise run as one batch: test_batch.py)."""
    from django_agentrun.failpoints import FailpointError

    settings.AGENTRUN_TOOL_CONCURRENCY = 1

    client = ScriptedClient(
        [
            reply(tool_use("lookup", {"query": "a"}), tool_use("lookup", {"query": "b"})),
            reply(text("ok")),
        ]
    )
    run = start_run("test-agent", "hello")
    monkeypatch.setenv("AGENTRUN_FAILPOINTS", f"{point}=raise")
    with pytest.raises(FailpointError):
        advance(run.pk, client=client)
    run.refresh_from_db()
    assert run.state == "awaiting_tool"
    assert_projection_matches(run)


# --------------------------------------------------------------------------- replay


def test_replay__advance_on_a_completed_run_does_nothing():
    run, client, _ = run_with([reply(tool_use("lookup", {"query": "a"})), reply(text("done"))])
    assert run.state == "completed"
    before = list(RunEvent.objects.filter(run=run).values_list("seq", "type"))
    requests = len(client.requests)
    executed = len(executions())
    for _ in range(3):
        assert advance(run.pk, client=client) == Outcome.NOT_CLAIMED
    run.refresh_from_db()
    assert list(RunEvent.objects.filter(run=run).values_list("seq", "type")) == before
    assert len(client.requests) == requests
    assert len(executions()) == executed
    assert run.lease_owner == ""
    assert_projection_matches(run)


def test_replay__advance_on_failed_and_cancelled_runs_does_nothing():
    from django_agentrun import cancel_run

    failed, client, _ = run_with([error("bad", retryable=False, status=400)])
    cancelled = start_run("test-agent", "hello")
    cancel_run(cancelled)
    for run in (failed, cancelled):
        run.refresh_from_db()
        seq = run.last_seq
        assert advance(run.pk, client=client) == Outcome.NOT_CLAIMED
        run.refresh_from_db()
        assert run.last_seq == seq
        assert_projection_matches(run)


# --------------------------------------------------------------------------- model errors


def test_model_error__non_retryable_fails_the_run(settings):
    settings.AGENTRUN_MODEL_RETRY_BASE_SECONDS = 0.001
    run, client, outcomes = run_with(
        [error("invalid_request_error: bad thing", retryable=False, status=400)]
    )
    assert outcomes == [Outcome.FINISHED]
    assert run.state == "failed"
    assert run.error_code == "model_error"
    assert run.failure_phase == "model"
    assert "bad thing" in run.error_message
    assert len(client.requests) == 1  # not retried
    turn = run.turns.get()
    assert turn.state == "failed" and turn.content is None
    assert run.turn_count == 0 and run.input_tokens == 0
    assert_projection_matches(run)


class Flaky:
    """A callable script: `failures` retryable errors, then an answer."""

    def __init__(self, failures, answer=None, status=500):
        self.failures = failures
        self.answer = answer or reply(text("finally"))
        self.status = status
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, request):
        with self.lock:
            self.calls += 1
            n = self.calls
        if n <= self.failures:
            return Reply([], error=ModelError("overloaded", retryable=True, status=self.status))
        return self.answer


@pytest.mark.parametrize("failures", [1, 3])
def test_model_error__retryable_is_retried_then_succeeds(settings, failures):
    settings.AGENTRUN_MODEL_RETRY_BASE_SECONDS = 0.001
    settings.AGENTRUN_MODEL_RETRIES = 3
    script = Flaky(failures)
    run, client, outcomes = run_with(script)
    assert outcomes == [Outcome.FINISHED]
    assert run.state == "completed"
    assert run.output["text"] == "finally"
    assert script.calls == failures + 1
    assert run.turns.get().model_attempts == failures + 1
    # Usage is counted once: for the recorded response only.
    assert run.turn_count == 1 and run.output_tokens == 10
    assert_projection_matches(run)


def test_model_error__retryable_scripted_error_then_next_reply(settings):
    settings.AGENTRUN_MODEL_RETRY_BASE_SECONDS = 0.001
    run, client, _ = run_with([error("overloaded"), reply(text("after one retry"))])
    assert run.state == "completed"
    assert run.output["text"] == "after one retry"
    assert len(client.requests) == 2
    assert_projection_matches(run)


@pytest.mark.parametrize("status", [500, 503])
def test_model_error__exhausted_retries_fail_as_unavailable(settings, status):
    settings.AGENTRUN_MODEL_RETRY_BASE_SECONDS = 0.001
    settings.AGENTRUN_MODEL_RETRIES = 2
    script = Flaky(failures=10**6, status=status)
    run, client, outcomes = run_with(script)
    assert outcomes == [Outcome.FINISHED]
    assert run.state == "failed"
    assert run.error_code == "model_unavailable"
    assert run.failure_phase == "model"
    assert script.calls == 3  # the first attempt and 2 retries
    assert run.turn_count == 0
    assert_projection_matches(run)


@pytest.mark.parametrize("status", [429, 529])
def test_rate_limited__parks_the_run_without_sleeping_then_goes_on(
    settings, status, monkeypatch, django_capture_on_commit_callbacks
):
    """A 429 (or 529) is never waited out in the worker's slot: the step ends, nothing
    recorded or paid, the lease given back with its time pushed to when the limit allows
    (so the reaper does not take the wait for a lost wake-up); the next claim asks again."""
    settings.AGENTRUN_MODEL_RETRY_BASE_SECONDS = 30  # a sleep would show
    script = Flaky(failures=2, status=status)
    client = ScriptedClient(script)
    run = start_run("test-agent", "hello")
    woken = []
    monkeypatch.setattr(wakeups, "send", lambda run_id, countdown=None: woken.append(countdown))
    for _ in range(2):
        started = time.monotonic()
        with django_capture_on_commit_callbacks(execute=True):
            assert advance(run.pk, client=client) == Outcome.CONTINUED
        assert time.monotonic() - started < 5
        assert 30 <= woken[-1] <= 36  # the wake-up comes when the limit allows
        run.refresh_from_db()
        assert (run.state, run.lease_owner, run.turn_count) in {
            ("running", "", 0),
            ("queued", "", 0),
        }
        assert run.lease_expires_at > timezone.now() + timedelta(seconds=20)
        assert not run.turns.exists() and run.input_tokens == 0
    assert advance(run.pk, client=client) == Outcome.FINISHED
    run.refresh_from_db()
    assert run.state == "completed" and run.output["text"] == "finally"
    assert script.calls == 3 and run.turn_count == 1 and run.output_tokens == 10
    assert run.recovery_attempts == 0
    assert_projection_matches(run)


def test_rate_limited__a_run_past_its_deadline_times_out(settings):
    settings.AGENTRUN_MODEL_RETRY_BASE_SECONDS = 0.01
    client = ScriptedClient(Flaky(failures=10**6, status=429))
    run = start_run("test-agent", "hello")
    assert advance(run.pk, client=client) == Outcome.CONTINUED
    Run.objects.filter(pk=run.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    assert advance(run.pk, client=client) == Outcome.FINISHED
    run.refresh_from_db()
    assert run.state == "timed_out"
    assert_projection_matches(run)


def test_model_error__in_a_later_turn_keeps_the_history_and_resumes(settings):
    from django_agentrun import resume_run

    settings.AGENTRUN_MODEL_RETRY_BASE_SECONDS = 0.001
    settings.AGENTRUN_MODEL_RETRIES = 0
    state = {"fail": True}

    def script(request):
        step = _step(request)
        if step == 0:
            return reply(tool_use("lookup", {"query": "a"}, id="toolu_hist"))
        if state["fail"]:
            return Reply([], error=ModelError("api error", retryable=True, status=500))
        return reply(text("recovered"))

    run, client, _ = run_with(script)
    assert run.state == "failed" and run.error_code == "model_unavailable"
    assert_projection_matches(run)
    state["fail"] = False
    resume_run(run)
    drive(run, client)
    assert run.state == "completed" and run.output["text"] == "recovered"
    assert len(executions("lookup")) == 1  # the recorded result is replayed, not re-run
    assert_requests_valid(client)
    assert_projection_matches(run)


# --------------------------------------------------------------------------- shared commits


def _event_types(run):
    return list(
        RunEvent.objects.filter(run_id=run.pk).order_by("seq").values_list("type", flat=True)
    )


def test_tools__next_call_goes_in_flight_with_the_previous_result(monkeypatch, settings):
    """Killed right after the first call's result committed: the second call is already
    in_flight (same commit), its handler not run; a new advance re-runs it (read_only).
    One call at a time (two lookups would otherwise run as one batch: test_batch.py)."""
    from django_agentrun.failpoints import FailpointError

    settings.AGENTRUN_TOOL_CONCURRENCY = 1

    client = ScriptedClient(
        [
            reply(tool_use("lookup", {"query": "a"}), tool_use("lookup", {"query": "b"})),
            reply(text("ok")),
        ]
    )
    run = start_run("test-agent", "hello")
    monkeypatch.setenv("AGENTRUN_FAILPOINTS", "tool.after_commit=raise")
    with pytest.raises(FailpointError):
        advance(run.pk, client=client)
    first, second = run.tool_calls.order_by("position")
    assert (first.state, second.state, second.attempt) == ("succeeded", "in_flight", 1)
    assert [e["query"] for e in executions("lookup")] == ["a"]
    assert _event_types(run)[-2:] == ["tool_call_finished", "tool_call_started"]
    monkeypatch.delenv("AGENTRUN_FAILPOINTS")
    from django_agentrun.models import Run

    Run.objects.filter(pk=run.pk).update(lease_owner="")  # as if the lease had lapsed
    drive(run, client)
    second.refresh_from_db()
    assert run.state == "completed"
    assert (second.state, second.attempt) == ("succeeded", 2)
    assert [e["query"] for e in executions("lookup")] == ["a", "b"]
    assert_projection_matches(run)


@pytest.mark.parametrize(
    ("second", "state"),
    [
        (tool_use("refund", {"amount_cents": 50_000}), "awaiting_approval"),  # needs a person
        (tool_use("bump_counter", {"name": "n"}), "succeeded"),  # atomic: its own commit
    ],
)
def test_tools__a_call_that_cannot_start_early_waits_for_its_own_turn(second, state):
    client = ScriptedClient([reply(tool_use("lookup", {"query": "a"}), second), reply(text("ok"))])
    run = start_run("approvals", "hello")
    advance(run.pk, client=client)
    first, other = run.tool_calls.order_by("position")
    assert first.state == "succeeded"
    assert other.state == state
    assert "tool_call_started" not in [
        e.type
        for e in RunEvent.objects.filter(run_id=run.pk, seq__gt=0)
        if e.payload.get("tool_call_id") == other.tool_call_id
    ]
    assert_projection_matches(run)


def test_tools__an_approval_policy_that_raises_does_not_lose_the_previous_result(monkeypatch):
    from tests.testapp import agents

    def broken(arguments, run):
        raise RuntimeError("policy bug")

    monkeypatch.setattr(agents.refund, "requires_approval", broken)
    client = ScriptedClient(
        [
            reply(tool_use("lookup", {"query": "a"}), tool_use("refund", {"amount_cents": 1})),
            reply(text("ok")),
        ]
    )
    run = start_run("approvals", "hello")
    with pytest.raises(RuntimeError, match="policy bug"):
        advance(run.pk, client=client)
    first, other = run.tool_calls.order_by("position")
    assert (first.state, other.state) == ("succeeded", "requested")
    assert executions("refund") == []
