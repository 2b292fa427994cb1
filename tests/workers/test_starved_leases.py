"""Leases that survive a saturated machine: a worker process stopped (SIGSTOP, as a
machine starved of CPU stops it) past its lease takes the lease back when it runs again,
if nobody took the run meanwhile, and keeps what it was doing (an answer that arrived is
recorded, never asked for twice); if somebody did, it ends itself at once."""

from __future__ import annotations

import signal
import time

import pytest

from django_agentrun import start_run, store
from django_agentrun.engine.heartbeat import EXIT_CODE
from django_agentrun.models import Run, RunEvent
from django_agentrun.recovery import reap
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use
from tests.conftest import assert_projection_matches
from tests.processes import wait_for
from tests.testapp.agents import executions

pytestmark = pytest.mark.timeout(90)

LEASE = 3
ENV = {"AGENTRUN_LEASE_SECONDS": str(LEASE), "AGENTRUN_CANCEL_GRACE_SECONDS": "5"}


def _lapsed(run: Run) -> bool:
    expires = Run.objects.values_list("lease_expires_at", flat=True).get(pk=run.pk)
    return expires is not None and expires < store.database_now()


def _stopped_past_the_lease(worker, run: Run, *, reaper: bool = False) -> None:
    """SIGSTOP the worker's process group until its lease has lapsed by a second (reaping
    meanwhile if asked), then SIGCONT it."""
    worker.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: _lapsed(run), timeout=LEASE + 5, interval=0.1, message="a lapse")
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            if reaper:
                reap()
            time.sleep(0.2)
    finally:
        worker.signal(signal.SIGCONT)


def _state(run: Run) -> str:
    run.refresh_from_db()
    return run.state


def test_stopped_during_the_model_call__takes_the_lease_back_and_keeps_the_answer(
    workers, messages_api, settings
):
    settings.AGENTRUN_LEASE_SECONDS = LEASE
    messages_api.script = by_step(
        [
            # The answer arrives while the worker is stopped (its first byte after 1 s).
            Reply([tool_use("slow_read", {"seconds": 0, "label": "q"})], latency=1.0),
            Reply([text("Done.")]),
        ]
    )
    worker = workers.start(**ENV)
    run = start_run("hardening", "Look it up.")
    wait_for(lambda: messages_api.requests, timeout=30, message="the model request")
    _stopped_past_the_lease(worker, run)
    wait_for(lambda: _state(run) == "completed", timeout=30, message="completed")
    assert worker.poll() is None, worker.tail()
    assert messages_api.steps() == {0: 1, 1: 1}  # no step asked for (paid) twice
    assert [r["phase"] for r in executions("slow_read")] == ["start", "end"]
    assert not RunEvent.objects.filter(run=run, type="recovery").exists()
    assert run.recovery_attempts == 0
    assert "taken back" in worker.log_text(), worker.tail()
    assert_projection_matches(run)


def test_stopped_during_a_tool__takes_the_lease_back_and_the_tool_runs_once(
    workers, messages_api, settings
):
    settings.AGENTRUN_LEASE_SECONDS = LEASE
    messages_api.script = by_step(
        [
            Reply([tool_use("slow_read", {"seconds": 1.5, "label": "s"}, id="toolu_s")]),
            Reply([text("Done.")]),
        ]
    )
    worker = workers.start(**ENV)
    run = start_run("hardening", "Read.")
    wait_for(lambda: executions("slow_read"), timeout=30, message="the handler to start")
    _stopped_past_the_lease(worker, run)
    wait_for(lambda: _state(run) == "completed", timeout=30, message="completed")
    assert worker.poll() is None, worker.tail()
    assert [r["phase"] for r in executions("slow_read")] == ["start", "end"]
    assert run.tool_calls.get().attempt == 1
    assert messages_api.steps() == {0: 1, 1: 1}
    assert not RunEvent.objects.filter(run=run, type="recovery").exists()
    assert_projection_matches(run)


def test_stopped_while_the_reaper_took_the_run__the_late_worker_ends_itself(
    workers, messages_api, settings
):
    """Somebody took the run while the worker was stopped (the reaper, then another worker):
    the late worker must not go on beside the new holder. It learns it at its first renewal
    and ends its process at once; the run completes elsewhere."""
    settings.AGENTRUN_LEASE_SECONDS = LEASE
    messages_api.script = by_step(
        [
            Reply([tool_use("slow_read", {"seconds": 15, "label": "r", "once": True})]),
            Reply([text("Done.")]),
        ]
    )
    first = workers.start(**ENV)
    run = start_run("hardening", "Read.")
    wait_for(lambda: executions("slow_read"), timeout=30, message="the handler to start")
    workers.start(**ENV)  # the worker the reaper's wake-up reaches
    _stopped_past_the_lease(first, run, reaper=True)
    assert workers.wait_exit(first, timeout=10) == EXIT_CODE, first.tail()
    wait_for(lambda: _state(run) == "completed", timeout=30, message="completed")
    assert RunEvent.objects.filter(run=run, type="recovery").exists()
    ends = [r for r in executions("slow_read") if r["phase"] == "end"]
    assert len(ends) == 1  # the late first attempt never finished beside the re-run
    assert_projection_matches(run)
