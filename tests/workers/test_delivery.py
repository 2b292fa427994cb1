"""Real Celery workers and the local Messages API: duplicate delivery executes a turn once,
and bad model output through the real Anthropic client keeps a history the API accepts."""

from __future__ import annotations

import re

import pytest

from django_agentrun import start_run
from django_agentrun.models import Run
from django_agentrun.tasks import advance_run
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use
from tests.conftest import assert_projection_matches
from tests.processes import wait_for, wait_resting
from tests.testapp.agents import executions

pytestmark = pytest.mark.timeout(90)


def wait_ready(procs, timeout=30):
    def ready():
        return all(b"ready." in p.log_path.read_bytes() for p in procs)

    wait_for(ready, timeout=timeout, interval=0.1, message="workers ready")


def outcomes(workers):
    """Outcomes of advance_run tasks, from the workers' 'succeeded' log lines, per worker."""
    found = []
    for proc in workers.procs:
        log = proc.log_path.read_text(errors="replace")
        found.append(re.findall(r"advance_run\[[^\]]+\] succeeded in [\d.]+s: '(\w+)'", log))
    return found


def assert_api_accepted_everything(messages_api):
    assert not messages_api.script_errors, messages_api.script_errors
    statuses = [r["status"] for r in messages_api.requests]
    assert statuses and all(s == 200 for s in statuses), statuses


# --------------------------------------------------------------------------- duplicate delivery


def test_duplicate_delivery__two_workers_execute_each_turn_once(workers, messages_api, queue):
    # Step 0 answers slowly, so the first worker holds the lease while the duplicates arrive.
    messages_api.script = by_step(
        [
            Reply(
                [
                    text("Working on it."),
                    tool_use("save_note", {"text": "note"}, id="toolu_note"),
                    tool_use("lookup", {"query": "q"}, id="toolu_look"),
                ],
                latency=2.0,
            ),
            Reply([text("All done.")]),
        ]
    )
    procs = [workers.start(), workers.start()]
    wait_ready(procs)
    run = start_run("test-agent", "Take a note and look something up.")  # enqueued on commit
    for _ in range(2):  # the same wake-up delivered again, at once, to the other worker too
        advance_run.apply_async(args=[str(run.pk)], queue=queue)
    wait_resting(run)

    assert run.state == "completed", (run.state, run.error_code, workers.logs())
    assert messages_api.steps() == {0: 1, 1: 1}
    assert len(executions("save_note")) == 1
    assert len(executions("lookup")) == 1
    assert_api_accepted_everything(messages_api)
    # Both workers took a message (three in all: one task did both turns); the ones that
    # found the lease held left quietly.
    wait_for(lambda: sum(len(o) for o in outcomes(workers)) >= 3, timeout=10)
    per_worker = outcomes(workers)
    assert all(per_worker), (per_worker, workers.logs())
    flat = [o for found in per_worker for o in found]
    assert flat.count("not_claimed") >= 1, flat
    assert flat.count("finished") == 1, flat
    assert "lease_lost" not in flat
    run.refresh_from_db()
    assert run.turn_count == 2
    assert run.recovery_attempts == 0
    assert_projection_matches(run)


def test_duplicate_delivery__after_completion_changes_nothing(workers, messages_api, queue):
    messages_api.script = by_step([Reply([text("Quick answer.")])])
    proc = workers.start()
    wait_ready([proc])
    run = start_run("test-agent", "Answer quickly.")
    wait_resting(run)
    assert run.state == "completed"
    seq = run.last_seq
    for _ in range(3):
        advance_run.apply_async(args=[str(run.pk)], queue=queue)
    wait_for(lambda: len(outcomes(workers)[0]) >= 4, timeout=20, message="duplicates handled")
    assert outcomes(workers)[0][1:] == ["not_claimed"] * 3
    run.refresh_from_db()
    assert run.last_seq == seq
    assert messages_api.steps() == {0: 1}
    assert_projection_matches(run)


# --------------------------------------------------------------------------- bad model output


def test_bad_output__through_the_real_client_the_api_accepts_every_history(workers, messages_api):
    messages_api.script = by_step(
        [
            # Unknown tool, wrong type, missing field, extra field: all in one turn.
            Reply(
                [
                    text("Trying some tools."),
                    tool_use("teleport", {"to": "mars"}, id="toolu_unknown"),
                    tool_use("lookup", {"query": 5}, id="toolu_type"),
                    tool_use("lookup", {}, id="toolu_missing"),
                    tool_use("lookup", {"query": "x", "limit": 3}, id="toolu_extra"),
                ]
            ),
            # A tool_use cut off by max_tokens mid-stream (its input JSON is incomplete).
            Reply(
                [
                    text("Saving a long note."),
                    tool_use("save_note", {"text": "a very long note " * 20}, id="toolu_cut"),
                ],
                truncate_input=True,
            ),
            Reply([text("I give up on tools.")]),
        ]
    )
    proc = workers.start()
    wait_ready([proc])
    run = start_run("test-agent", "Use your tools badly.")
    wait_resting(run)

    assert run.state == "completed", (run.state, run.error_code, run.error_message, workers.logs())
    assert run.output["text"] == "I give up on tools."
    assert_api_accepted_everything(messages_api)
    assert messages_api.steps() == {0: 1, 1: 1, 2: 1}
    assert executions("lookup") == [] and executions("save_note") == []

    calls = {c.tool_call_id: c for c in run.tool_calls.all()}
    assert set(calls) == {
        "toolu_unknown",
        "toolu_type",
        "toolu_missing",
        "toolu_extra",
        "toolu_cut",
    }
    for call in calls.values():
        assert call.state == "errored" and call.is_error and call.result_source == "synthetic"
        assert call.attempt == 0
    assert "Unknown tool 'teleport'" in calls["toolu_unknown"].result
    assert "query: Input should be a valid string" in calls["toolu_type"].result
    assert "query: Field required" in calls["toolu_missing"].result
    assert "limit: Extra inputs are not permitted" in calls["toolu_extra"].result
    assert "cut off by the max_tokens limit" in calls["toolu_cut"].result
    assert run.turns.get(index=1).stop_reason == "max_tokens"

    # What the server got back: each tool_use answered, first thing, by an is_error result.
    step1 = next(b for b in messages_api.bodies if len(b["messages"]) == 3)
    results = step1["messages"][2]["content"]
    assert [r["tool_use_id"] for r in results] == [
        "toolu_unknown",
        "toolu_type",
        "toolu_missing",
        "toolu_extra",
    ]
    assert all(r["is_error"] is True for r in results)
    step2 = next(b for b in messages_api.bodies if len(b["messages"]) == 5)
    truncated = step2["messages"][3]["content"][-1]
    assert truncated["type"] == "tool_use" and truncated["id"] == "toolu_cut"
    assert isinstance(truncated["input"], dict)
    assert step2["messages"][4]["content"][0]["tool_use_id"] == "toolu_cut"
    assert Run.objects.get(pk=run.pk).turn_count == 3
    assert_projection_matches(run)
