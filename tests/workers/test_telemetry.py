"""Telemetry through real worker processes: each worker has the OpenTelemetry SDK installed
the way a host installs it (the example project's settings, AGENTRUN_TELEMETRY_DIR), and
writes its spans and metrics to files this test reads; the test process keeps its own in
the SDK's in-memory exporter and metric reader. One trace per run, across processes, an
approval and a crash."""

from __future__ import annotations

import json

import pytest
from opentelemetry import trace

from django_agentrun import approve_tool_call, start_run
from django_agentrun.models import Run
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use
from django_agentrun.testing.telemetry import in_memory, read_metrics, read_spans, span_dict
from tests.processes import wait_for, wait_resting

pytestmark = pytest.mark.timeout(120)

PROMPT = "Please remove the account of mallory-7431."


@pytest.fixture
def telemetry(tmp_path):
    """(directory the workers write to, the test process's span exporter)."""
    exporter, _ = in_memory()
    exporter.clear()
    folder = tmp_path / "telemetry"
    yield folder, exporter
    exporter.clear()


def spans_of(folder, exporter) -> list[dict]:
    return read_spans(folder) + [span_dict(s) for s in exporter.get_finished_spans()]


def named(spans: list[dict], prefix: str) -> list[dict]:
    return [s for s in spans if s["name"].startswith(prefix)]


def only(spans: list[dict], prefix: str) -> dict:
    found = named(spans, prefix)
    assert len(found) == 1, [s["name"] for s in spans]
    return found[0]


def test_run_with_two_turns_a_tool_and_an_approval__one_trace_across_processes(
    workers, messages_api, telemetry
):
    folder, exporter = telemetry
    messages_api.script = by_step(
        [
            Reply([tool_use("delete_account", {"user": "mallory"}, id="toolu_del")]),
            Reply([text("Deleted.")]),
        ]
    )
    workers.start(AGENTRUN_TELEMETRY_DIR=str(folder))
    caller = trace.get_tracer("the-host")
    with caller.start_as_current_span("host view") as view:
        run = start_run("test-agent", PROMPT)
    wait_resting(run)
    assert run.state == "awaiting_approval"
    approve_tool_call(run.tool_calls.get(), by=None, note="ok")
    wait_resting(run)
    assert run.state == "completed", (run.state, run.error_code)

    spans = wait_for(
        lambda: (s := spans_of(folder, exporter)) and len(named(s, "invoke_agent")) == 2 and s,
        message="both stretches' spans",
    )
    trace_id = format(view.get_span_context().trace_id, "032x")
    ours = [s for s in spans if s["scope"] != "the-host"]
    assert {s["trace_id"] for s in ours} == {trace_id}, [(s["name"], s["pid"]) for s in ours]
    start = only(spans, "start_run")
    assert start["parent_id"] == format(view.get_span_context().span_id, "016x")
    assert run.trace_context["traceparent"].split("-")[1] == trace_id

    first, second = sorted(named(spans, "invoke_agent"), key=lambda s: s["start"])
    for stretch in (first, second):
        assert stretch["name"] == "invoke_agent test-agent"
        assert stretch["parent_id"] == start["span_id"]
        assert stretch["kind"] == "INTERNAL"
        attributes = stretch["attributes"]
        assert attributes["gen_ai.operation.name"] == "invoke_agent"
        assert attributes["gen_ai.agent.name"] == "test-agent"
        assert attributes["agentrun.run.id"] == str(run.pk)
        assert stretch["pid"] != start["pid"]  # the worker's, not the test's
    assert first["attributes"]["agentrun.outcome"] == "parked"
    assert "agentrun.approval_requested" in [e["name"] for e in first["events"]]
    assert second["attributes"]["agentrun.outcome"] == "finished"
    assert second["attributes"]["agentrun.run.state"] == "completed"

    # The SDK's own chat span, one per request, each the child of its stretch's span, with
    # the turn, the attempt and the finish reasons the app adds to it.
    chats = sorted(named(spans, "anthropic.messages.create"), key=lambda s: s["start"])
    assert [c["parent_id"] for c in chats] == [first["span_id"], second["span_id"]]
    assert len([s for s in spans if s["attributes"].get("gen_ai.operation.name") == "chat"]) == 2
    assert [c["attributes"]["agentrun.turn.index"] for c in chats] == [0, 1]
    assert all(c["attributes"]["agentrun.model.attempt"] == 1 for c in chats)
    assert [c["attributes"]["gen_ai.response.finish_reasons"] for c in chats] == [
        ["tool_use"],
        ["end_turn"],
    ]

    tool = only(spans, "execute_tool")
    assert tool["name"] == "execute_tool delete_account"
    assert tool["parent_id"] == second["span_id"]
    attributes = tool["attributes"]
    assert attributes["gen_ai.tool.name"] == "delete_account"
    assert attributes["gen_ai.tool.call.id"] == "toolu_del"
    assert attributes["gen_ai.tool.type"] == "function"
    assert attributes["agentrun.tool.side_effect"] == "non_idempotent"
    assert attributes["agentrun.tool.outcome"] == "executed"
    assert attributes["agentrun.tool.attempt"] == 1
    assert attributes["agentrun.approval.wait_seconds"] >= 0

    approval = only(spans, "approval")
    assert approval["parent_id"] == start["span_id"]
    assert approval["attributes"]["agentrun.approval.decision"] == "approved"
    assert approval["attributes"]["agentrun.approval.wait_seconds"] > 0

    # No content by default: neither the prompt nor the tool's arguments, in any span.
    dumped = json.dumps(spans)
    assert "mallory" not in dumped
    assert "gen_ai.input.messages" not in dumped


def test_crash_mid_tool__the_recovery_joins_the_run_s_trace(
    workers, messages_api, queue, telemetry
):
    """The worker is SIGKILLed while the (read_only) tool runs; another worker takes the run
    over: its stretch is in the same trace, with the recovery as an event."""
    from django_agentrun.tasks import advance_run

    folder, exporter = telemetry
    messages_api.script = by_step(
        [Reply([tool_use("slow", {"seconds": 4}, id="toolu_slow")]), Reply([text("Done.")])]
    )
    first = workers.start(AGENTRUN_TELEMETRY_DIR=str(folder))
    run = start_run("test-agent", "Take your time.")
    wait_for(
        lambda: run.tool_calls.filter(state="in_flight").exists(),
        timeout=30,
        message="the tool to start",
    )
    workers.kill(first)
    workers.start(AGENTRUN_TELEMETRY_DIR=str(folder))
    advance_run.apply_async(args=[str(run.pk)], queue=queue)  # as a redelivery would
    wait_resting(run, timeout=60)
    assert run.state in ("completed", "awaiting_approval"), (run.state, run.error_code)

    spans = wait_for(
        lambda: (s := spans_of(folder, exporter)) and named(s, "invoke_agent") and s,
        message="the recovery's span",
    )
    start = only(spans, "start_run")
    # The killed worker's stretch never ended (nor was exported); the recovery's did.
    recovered = named(spans, "invoke_agent")
    assert len(recovered) == 1
    assert recovered[0]["trace_id"] == start["trace_id"]
    assert recovered[0]["parent_id"] == start["span_id"]
    assert recovered[0]["pid"] == workers.procs[1].pid
    assert "agentrun.recovery" in [e["name"] for e in recovered[0]["events"]]
    tools = named(spans, "execute_tool")
    assert {s["trace_id"] for s in tools} <= {start["trace_id"]}

    metrics = wait_for(
        lambda: (m := read_metrics(folder)).get("agentrun.recoveries") and m,
        message="the recovery counted",
    )
    assert metrics["agentrun.recoveries"][0]["attributes"]["gen_ai.agent.name"] == "test-agent"


def test_content__only_when_the_host_opts_in(workers, messages_api, telemetry, settings):
    folder, exporter = telemetry
    settings.AGENTRUN_TELEMETRY_CAPTURE_CONTENT = True
    messages_api.script = by_step(
        [Reply([tool_use("lookup", {"query": "mallory"}, id="toolu_q")]), Reply([text("Found.")])]
    )
    workers.start(
        AGENTRUN_TELEMETRY_DIR=str(folder),
        OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true",
    )
    run = start_run("test-agent", PROMPT)
    wait_resting(run)
    assert run.state == "completed"
    spans = wait_for(
        lambda: (s := spans_of(folder, exporter)) and named(s, "invoke_agent") and s,
        message="the stretch's span",
    )
    start = only(spans, "start_run")
    assert PROMPT in start["attributes"]["gen_ai.input.messages"]
    tool = only(spans, "execute_tool")
    assert json.loads(tool["attributes"]["gen_ai.tool.call.arguments"]) == {"query": "mallory"}
    assert "gen_ai.tool.call.result" in tool["attributes"]
    stretch = only(spans, "invoke_agent")
    assert "Found." in stretch["attributes"]["gen_ai.output.messages"]
    # The SDK's chat span has the prompt too (its content mode follows the opt-in).
    chats = named(spans, "anthropic.messages.create")
    assert any(PROMPT in json.dumps(c["attributes"]) for c in chats)


def test_metrics__each_with_its_attributes(workers, messages_api, telemetry):
    folder, _ = telemetry
    messages_api.script = by_step(
        [Reply([tool_use("lookup", {"query": "q"}, id="toolu_m")]), Reply([text("Done.")])]
    )
    workers.start(AGENTRUN_TELEMETRY_DIR=str(folder))
    run = start_run("test-agent", "Look it up.")
    wait_resting(run)
    assert run.state == "completed"
    wanted = {
        "gen_ai.client.token.usage",
        "gen_ai.client.operation.duration",
        "agentrun.runs.finished",
        "agentrun.run.duration",
        "agentrun.turn.duration",
        "agentrun.tool.duration",
        "agentrun.run.queue_lag",
        "agentrun.cost",
    }
    metrics = wait_for(
        lambda: (m := read_metrics(folder)) and wanted <= set(m) and m,
        message="every metric exported",
    )
    usage = metrics["gen_ai.client.token.usage"]
    assert {p["attributes"]["gen_ai.token.type"] for p in usage} == {"input", "output"}
    for point in usage:
        assert point["unit"] == "{token}"
        assert point["count"] == 2  # two answers
        assert point["attributes"]["gen_ai.operation.name"] == "chat"
        assert point["attributes"]["gen_ai.provider.name"] == "anthropic"
        assert point["attributes"]["gen_ai.request.model"] == "claude-sonnet-4-6"
        assert point["explicit_bounds"][:3] == [1, 4, 16]
    (duration,) = metrics["gen_ai.client.operation.duration"]
    assert duration["unit"] == "s" and duration["count"] == 2
    assert duration["explicit_bounds"][:2] == [0.01, 0.02]
    (finished,) = metrics["agentrun.runs.finished"]
    assert finished["attributes"] == {
        "gen_ai.agent.name": "test-agent",
        "agentrun.run.state": "completed",
    }
    assert finished["value"] == 1
    (tool,) = metrics["agentrun.tool.duration"]
    assert tool["attributes"] == {"gen_ai.tool.name": "lookup", "agentrun.tool.outcome": "executed"}
    (turns,) = metrics["agentrun.turn.duration"]
    assert turns["count"] == 2
    assert metrics["agentrun.run.queue_lag"][0]["attributes"] == {"gen_ai.agent.name": "test-agent"}
    (cost,) = metrics["agentrun.cost"]
    assert cost["value"] > 0 and cost["unit"] == "USD"
    assert Run.objects.get(pk=run.pk).cost_usd > 0
