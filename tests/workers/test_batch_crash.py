"""Parallel tool calls, killed: a real worker dies (os._exit at a failpoint, as a power cut)
inside or around a batch; a fresh worker and the reaper finish the run. Each call safe to
run again ran again only when it had no recorded result; the non-idempotent call ran once.

The turn: [lookup a, save_note n] (a batch), send_message (alone, non-idempotent with a
reconcile check), [lookup b, slow 0.5 s] (a batch); then the model answers.
"""

from __future__ import annotations

import pytest

from django_agentrun import start_run
from django_agentrun.recovery import reap
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use
from tests.conftest import assert_projection_matches
from tests.processes import wait_resting
from tests.testapp.agents import executions

CALLS = [
    tool_use("lookup", {"query": "a"}, id="toolu_a"),
    tool_use("save_note", {"text": "n"}, id="toolu_n"),
    tool_use("send_message", {"to": "ann@example.com", "body": "Hi"}, id="toolu_send"),
    tool_use("lookup", {"query": "b"}, id="toolu_b"),
    tool_use("slow", {"seconds": 0.5}, id="toolu_slow"),
]

POINTS = [
    "tool.before_handler@save_note",  # inside the first batch, lookup a running or done
    "tool.after_handler@lookup",  # inside the first batch: lookup a returned
    "tool.after_batch",  # the first batch's handlers all returned, nothing recorded
    "tool.after_commit@lookup",  # the first batch's results and send_message's in_flight
    "tool.after_handler@send_message",  # the message sent, its result not recorded
    "tool.after_handler@slow",  # inside the second batch: lookup b returned or not
]


@pytest.mark.parametrize("point", POINTS)
def test_batch_crash__only_calls_without_a_result_run_again(point, workers, messages_api, settings):
    settings.AGENTRUN_LEASE_SECONDS = 2
    messages_api.script = by_step([Reply(CALLS), Reply([text("Done.")])])
    first = workers.start(failpoints=f"{point}=crash", AGENTRUN_LEASE_SECONDS="2")
    run = start_run("test-agent", "Look things up, tell Ann.")
    assert workers.wait_exit(first, timeout=60) != 0, workers.logs()
    recorded = set(run.tool_calls.filter(state="succeeded").values_list("tool_call_id", flat=True))
    workers.start(AGENTRUN_LEASE_SECONDS="2")
    wait_resting(run, timeout=60, interval=0.3, before=lambda: reap(stale_after=1))

    assert run.state == "completed", (run.state, run.error_code, run.error_message, workers.logs())
    assert_projection_matches(run)
    assert len(executions("send_message")) == 1
    calls = {c.tool_call_id: c for c in run.tool_calls.all()}
    assert {c.state for c in calls.values()} == {"succeeded"}
    ran = {
        "toolu_a": [r for r in executions("lookup") if r["query"] == "a"],
        "toolu_b": [r for r in executions("lookup") if r["query"] == "b"],
        "toolu_n": executions("save_note"),
    }
    for call_id, rows in ran.items():
        if call_id in recorded:
            assert len(rows) == 1, (point, call_id, rows)  # replayed, never run again
        else:
            assert 1 <= len(rows) <= 2, (point, call_id, rows)
        assert len({r["key"] for r in rows}) == 1  # the same idempotency key each time
    # What the crash left unrecorded was found in flight: it ran again (or was reconciled).
    if point == "tool.after_batch":
        assert len(ran["toolu_a"]) == len(ran["toolu_n"]) == 2
    if point == "tool.after_handler@slow":
        assert {"toolu_a", "toolu_n", "toolu_send"} <= recorded
    assert not messages_api.script_errors
    assert set(messages_api.steps()) == {0, 1}
    assert all(n == 1 for n in messages_api.steps().values())
