"""Telemetry in the request's process (the SDK's in-memory exporter and metric reader): the
client's W3C `traceparent` continued by `POST /runs/` and a conversation's `messages/`
without any Django instrumentation, the run keeping its trace context, the runs-started
counter, the log records' fields; and without an SDK, nothing recorded."""

from __future__ import annotations

import logging

import pytest
from django.urls import reverse
from opentelemetry import trace
from rest_framework.test import APIClient

from django_agentrun import start_conversation, start_run, telemetry
from django_agentrun.models import Run
from django_agentrun.testing.telemetry import in_memory
from tests import factories

# Spans and metrics through the API: the same on any Postgres driver and binding.
pytestmark = pytest.mark.one_driver

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture
def sdk():
    exporter, reader = in_memory()
    exporter.clear()
    reader.collect()  # what earlier tests recorded is read out of the way
    yield exporter, reader
    exporter.clear()


@pytest.fixture
def alice(db):
    return factories.user("alice")


def client_of(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user=user)
    return client


def test_post_runs__continues_the_client_s_traceparent(sdk, alice, no_broker):
    exporter, _ = sdk
    response = client_of(alice).post(
        reverse("agentrun:run-list"),
        {"agent": "test-agent", "input": "Hello"},
        format="json",
        HTTP_TRACEPARENT=TRACEPARENT,
        HTTP_TRACESTATE="vendor=x",
    )
    assert response.status_code == 201, response.content
    (span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("start_run")]
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert format(span.parent.span_id, "016x") == PARENT_ID
    assert span.parent.is_remote
    stored = Run.objects.get(pk=response.json()["id"]).trace_context
    assert stored["traceparent"] == f"00-{TRACE_ID}-{format(span.context.span_id, '016x')}-01"
    assert stored["tracestate"] == "vendor=x"


def test_conversation_messages__continue_the_client_s_traceparent(sdk, alice, no_broker):
    exporter, _ = sdk
    conversation = start_conversation("test-agent", owner=alice)
    response = client_of(alice).post(
        reverse("agentrun:conversation-messages", args=[conversation.pk]),
        {"input": "Hello"},
        format="json",
        HTTP_TRACEPARENT=TRACEPARENT,
    )
    assert response.status_code == 201, response.content
    (span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("start_run")]
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.attributes["gen_ai.conversation.id"] == str(conversation.pk)


@pytest.mark.parametrize("header", ["", "garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01"])
def test_post_runs__without_a_valid_traceparent__a_trace_of_its_own(sdk, alice, no_broker, header):
    exporter, _ = sdk
    response = client_of(alice).post(
        reverse("agentrun:run-list"),
        {"agent": "test-agent", "input": "Hello"},
        format="json",
        HTTP_TRACEPARENT=header,
    )
    assert response.status_code == 201
    (span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("start_run")]
    assert span.parent is None


def test_start_run__inside_a_span__belongs_to_its_trace_and_counts(sdk, db, no_broker):
    exporter, reader = sdk
    before = started(reader)
    with trace.get_tracer("host").start_as_current_span("task") as outer:
        run = start_run("test-agent", "Hello")
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "start_run test-agent"]
    assert span.context.trace_id == outer.get_span_context().trace_id
    assert span.attributes["agentrun.run.id"] == str(run.pk)
    assert "gen_ai.input.messages" not in span.attributes  # no content by default
    assert started(reader) == before + 1


def started(reader) -> int:
    """The runs-started counter of test-agent (cumulative: this process's whole session)."""
    points = [
        p
        for m in collected(reader)
        if m.name == "agentrun.runs.started"
        for p in m.data.data_points
        if dict(p.attributes) == {"gen_ai.agent.name": "test-agent"}
    ]
    return sum(p.value for p in points)


def collected(reader) -> list:
    """Every metric the reader collects now; none (not None) before this process recorded
    any: which test of this module runs first in a process depends on the test runner's
    split of the suite."""
    data = reader.get_metrics_data()
    if data is None:
        return []
    return [m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]


def test_log_records__carry_the_run_the_turn_and_the_trace(sdk, caplog):
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("django_agentrun.engine.driver")
    logger.addHandler(handler)
    try:
        run = Run(pk="00000000-0000-0000-0000-000000000001", agent="a", config={})
        with telemetry.invoke_agent(run, "m") as stretch:
            telemetry.at_turn(3)
            logger.warning("inside")
        logger.warning("outside")
    finally:
        logger.removeHandler(handler)
    inside, outside = records
    assert (inside.run_id, inside.agent, inside.turn) == (str(run.pk), "a", 3)
    assert inside.trace_id == format(stretch.span.get_span_context().trace_id, "032x")
    assert (outside.run_id, outside.agent, outside.turn) == (None, None, None)
    assert not hasattr(outside, "trace_id")


NO_SDK = """
import django, types
django.setup()
from opentelemetry import trace
from django_agentrun import telemetry
run = types.SimpleNamespace(pk=1, agent="a", input="secret", conversation_id=None, config={})
assert telemetry.run_created(run) == {}
with telemetry.invoke_agent(run, "m") as stretch:
    assert not stretch.span.is_recording()
    assert not trace.get_current_span().get_span_context().is_valid
print(type(trace.get_tracer_provider()).__name__)
"""


def test_without_an_sdk__nothing_records_and_the_run_keeps_no_context():
    import os
    import subprocess
    import sys

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    env.pop("AGENTRUN_TELEMETRY_DIR", None)
    done = subprocess.run(
        [sys.executable, "-c", NO_SDK], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ProxyTracerProvider"


def counted(reader, name: str, **attributes) -> int:
    """A counter's value over the data points whose attributes include `attributes`."""
    return sum(
        p.value
        for m in collected(reader)
        if m.name == name
        for p in m.data.data_points
        if attributes.items() <= dict(p.attributes).items()
    )


def test_runs_finished__whoever_ends_the_run_counts_it_once(
    sdk, db, no_broker, django_capture_on_commit_callbacks
):
    """The reaper timing out a run, a person cancelling one, a worker completing one: each
    counted once, after its commit, with the state it ended in."""
    from datetime import timedelta

    from django.utils import timezone

    from django_agentrun import cancel_run
    from django_agentrun.recovery import reap
    from django_agentrun.testing import ScriptedClient, reply, text
    from tests.conftest import drive

    _, reader = sdk

    def finished(state: str) -> int:
        return counted(
            reader,
            "agentrun.runs.finished",
            **{"gen_ai.agent.name": "test-agent", "agentrun.run.state": state},
        )

    before = {s: finished(s) for s in ("timed_out", "cancelled", "completed")}
    with django_capture_on_commit_callbacks(execute=True):
        late = start_run("test-agent", "go", deadline=timezone.now() - timedelta(seconds=1))
        cancelled = start_run("test-agent", "never mind")
        done = start_run("test-agent", "hi")
    with django_capture_on_commit_callbacks(execute=True):
        reap()
    with django_capture_on_commit_callbacks(execute=True):
        cancel_run(cancelled, reason="not needed")
    with django_capture_on_commit_callbacks(execute=True):
        drive(done, ScriptedClient([reply(text("hello"))]))
    for run, state in ((late, "timed_out"), (cancelled, "cancelled"), (done, "completed")):
        run.refresh_from_db()
        assert run.state == state
        assert finished(state) == before[state] + 1, state


def test_model_retries__a_rate_limit_park_counts_as_a_retry(sdk, db, no_broker, settings):
    """A 429 parks the run (it asks again later, outside the slot): a retry of the model
    request all the same, marked as parked."""
    from django_agentrun.clients import ModelError
    from django_agentrun.engine import Outcome, advance
    from django_agentrun.testing import Reply, ScriptedClient

    _, reader = sdk
    settings.AGENTRUN_MODEL_RETRY_BASE_SECONDS = 0.001

    def parked() -> int:
        return counted(
            reader,
            "agentrun.model.retries",
            **{"agentrun.retry.parked": True, "http.response.status_code": 429},
        )

    before = parked()
    limited = Reply([], error=ModelError("rate limited", retryable=True, status=429))
    run = start_run("test-agent", "hello")
    assert advance(run.pk, client=ScriptedClient([limited])) == Outcome.CONTINUED
    assert parked() == before + 1


def test_chat_span__one_per_model_request__the_sdk_s_with_the_answer_s_facts(
    sdk, db, no_broker, settings, agentrun_messages_api
):
    """Through the real SDK and the Messages API stand-in: each model request has exactly
    one `chat` span, the SDK's, the child of its stretch's span; the app adds what the
    SDK's lacks (the turn and the attempt from its start, the finish reasons, the cache
    writes under the conventions' name, the cache-read share); no span has an event per
    answer any more."""
    from django_agentrun.testing import drive
    from django_agentrun.testing.messages_api import Reply, by_step, error, text, tool_use

    exporter, _ = sdk
    settings.AGENTRUN_MODEL_RETRY_BASE_SECONDS = 0.001
    usage = {
        "input_tokens": 100,
        "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 300,
        "output_tokens": 20,
    }
    answers = by_step(
        [
            Reply([tool_use("lookup", {"query": "q"}, id="toolu_1")], usage=usage),
            Reply([text("Done.")]),
        ]
    )
    asked: list[int] = []

    def script(body):
        asked.append(1)
        return error(500) if len(asked) == 1 else answers(body)  # the first attempt fails

    agentrun_messages_api.script = script
    run = drive(start_run("test-agent", "Look it up."))
    assert run.state == "completed", (run.state, run.error_code)

    spans = exporter.get_finished_spans()
    chats = sorted(
        (s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"),
        key=lambda s: s.start_time,
    )
    assert len(asked) == 3
    assert [s.name for s in chats] == ["anthropic.messages.create"] * 3  # the SDK's, never two
    assert {s.instrumentation_scope.name for s in chats} == {"com.anthropic.sdk.python"}
    stretches = {s.context.span_id for s in spans if s.name == "invoke_agent test-agent"}
    assert all(s.parent.span_id in stretches for s in chats)

    failed, first, second = (dict(s.attributes) for s in chats)
    assert (failed["agentrun.turn.index"], failed["agentrun.model.attempt"]) == (0, 1)
    assert failed["error.type"] == "api_error"
    assert "gen_ai.response.finish_reasons" not in failed

    assert (first["agentrun.turn.index"], first["agentrun.model.attempt"]) == (0, 2)
    assert first["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert first["gen_ai.usage.cache_creation.input_tokens"] == 100
    assert first["gen_ai.usage.cache_read.input_tokens"] == 300  # the SDK's own
    assert first["gen_ai.usage.input_tokens"] == 500  # the SDK's: cache reads and writes in
    assert first["gen_ai.usage.output_tokens"] == 20
    assert first["agentrun.cache_read.share"] == 0.6

    assert (second["agentrun.turn.index"], second["agentrun.model.attempt"]) == (1, 1)
    assert second["gen_ai.response.finish_reasons"] == ("end_turn",)
    assert not [e.name for s in spans for e in s.events if e.name == "gen_ai.turn"]


def histogram_count(reader, name: str) -> int:
    return sum(p.count for m in collected(reader) if m.name == name for p in m.data.data_points)


def test_turn_durations__each_turn_once__by_the_stretch_that_closed_it(
    sdk, db, no_broker, settings
):
    """One turn a stretch (TURNS_PER_TASK 1): each stretch records the duration of the turn
    it closed, none of the turns earlier stretches closed, and none of the turn still open."""
    from django_agentrun.testing import ScriptedClient, reply, text, tool_use
    from tests.conftest import drive

    _, reader = sdk
    settings.AGENTRUN_TURNS_PER_TASK = 1
    before = histogram_count(reader, "agentrun.turn.duration")
    client = ScriptedClient(
        [
            reply(tool_use("lookup", {"query": "a"})),
            reply(tool_use("lookup", {"query": "b"})),
            reply(text("Done.")),
        ]
    )
    run = start_run("test-agent", "Look a and b up.")
    outcomes = drive(run, client)
    assert run.state == "completed", (run.state, run.error_code)
    assert len(outcomes) >= 3  # a stretch a turn
    assert histogram_count(reader, "agentrun.turn.duration") == before + 3
