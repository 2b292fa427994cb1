"""The edges of the engine's second pass that only real processes show: an atomic tool
under its own lease, and a tool's child process outliving its SIGKILLed worker."""

from __future__ import annotations

import time

import pytest

from django_agentrun import start_run
from django_agentrun.models import Run, RunEvent
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use
from tests.conftest import assert_projection_matches
from tests.processes import wait_for, wait_resting
from tests.testapp.agents import executions

pytestmark = pytest.mark.timeout(120)


def _script(name: str, arguments: dict) -> object:
    return by_step([Reply([tool_use(name, arguments, id="toolu_edge")]), Reply([text("Done.")])])


@pytest.mark.parametrize("seconds", [1.7, 4.5])
def test_atomic_tool__longer_than_its_lease_or_not__runs_once_and_completes(
    workers, messages_api, settings, seconds
):
    """The atomic tool's handler runs inside the transaction that records its result. The
    step used to hold the run row locked meanwhile, so the heartbeat's renewal waited on
    it: 1.7 s under a 3 s lease ended the run recovery_exhausted, and one longer than the
    lease had the watchdog end the worker, the call rolled back and re-run, again and
    again. The lease is renewed while it runs now."""
    settings.AGENTRUN_LEASE_SECONDS = 3
    messages_api.script = _script("slow_counter", {"name": "edge", "seconds": seconds})
    workers.start(AGENTRUN_LEASE_SECONDS="3", AGENTRUN_HEARTBEAT_SECONDS="0.2")
    run = start_run("hardening", "Count slowly.")
    wait_resting(run, timeout=60)
    assert run.state == "completed", (run.state, run.error_code, run.error_message)
    assert [r["phase"] for r in executions("slow_counter")] == ["start", "end"]
    call = run.tool_calls.get()
    assert (call.state, call.result) == ("succeeded", 1)
    assert not RunEvent.objects.filter(run=run, type="recovery").exists()
    assert_projection_matches(run)


def test_subprocess_child__dies_with_its_worker_and_never_has_its_effect_twice(
    workers, messages_api, queue, settings
):
    """A non_idempotent tool's child process has its effect 6 s after it starts. Its
    worker is SIGKILLed meanwhile; a duplicate wake-up reaches a new worker, which takes
    the dead holder's lease over at once. The child used to live on (a session of its own)
    while the recovery's reconcile check found no effect and ran the tool again: two
    effects. The child dies with its worker now, and a take-over first kills whatever the
    dead holder left: one effect, from the second attempt."""
    from django_agentrun.tasks import advance_run

    settings.AGENTRUN_LEASE_SECONDS = 30  # only the early take-over (a dead pid) applies
    messages_api.script = _script("child_effect", {"seconds": 6})
    first = workers.start(AGENTRUN_LEASE_SECONDS="30")
    run = start_run("hardening", "Deliver it.")
    wait_for(lambda: executions("child_effect"), timeout=30, message="the child to start")
    workers.kill(first)
    workers.start(AGENTRUN_LEASE_SECONDS="30")
    advance_run.apply_async(args=[str(run.pk)], queue=queue)  # as a redelivery would
    wait_resting(run, timeout=60)
    time.sleep(6.5)  # long enough for an orphaned first child to have its effect
    assert run.state == "completed", (run.state, run.error_code, run.error_message)
    effects = [r for r in executions("child_effect") if r["phase"] == "effect"]
    assert len(effects) == 1, executions("child_effect")
    starts = [r for r in executions("child_effect") if r["phase"] == "start"]
    assert [r["attempt"] for r in starts] == [1, 2]
    assert effects[0]["attempt"] == 2
    assert Run.objects.get(pk=run.pk).recovery_attempts == 0  # the turn completed since
    assert RunEvent.objects.filter(run=run, type="recovery").count() == 1
    assert_projection_matches(run)
