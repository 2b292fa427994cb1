"""A worker's wall clock judges nothing the database's clock judges (invariant 9): a worker
whose clock jumped (NTP stepping it, a VM resumed) neither ends a lease early nor keeps
one alive, nor times a run out, nor sets the time a person has to decide.
The chaos soak (tests/workers/test_chaos.py) runs a worker and the reaper with a jumping
clock; these pin what it relies on, in one process, with `timezone.now` moved."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_agentrun import start_run, store
from django_agentrun.identity import worker_identity
from django_agentrun.models import Run
from django_agentrun.recovery import reap
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.conftest import drive

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def clock_ahead(monkeypatch):
    """This process's wall clock, two hours ahead of the database's."""
    real_now = timezone.now

    def ahead(hours: float = 2) -> None:
        monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(hours=hours))

    return ahead


def test_lease__renewed_by_the_database_clock_with_a_worker_clock_ahead(clock_ahead):
    run = start_run("test-agent", "x")
    claimed = store.claim(run.pk, worker_identity(), history=False)
    assert claimed is not None
    clock_ahead()
    held, _ = store.renew_lease(claimed.lease)
    assert held
    expires = Run.objects.values_list("lease_expires_at", flat=True).get(pk=run.pk)
    assert expires - store.database_now() < timedelta(minutes=5)  # not two hours out
    assert not [f for f in reap().findings if f.run_id == str(run.pk)]


def test_deadline__a_worker_clock_ahead_does_not_time_a_run_out(clock_ahead):
    run = start_run("test-agent", "x", deadline=timedelta(hours=1))
    clock_ahead()  # the deadline is an hour away by the database's clock
    drive(run, ScriptedClient([reply(text("Done."))]))
    assert run.state == "completed", (run.state, run.stop_reason)


def test_approval_deadline__counted_from_the_database_clock(clock_ahead):
    run = start_run("approvals", "x")  # an hour for a person to decide
    clock_ahead(-2)  # a worker whose clock runs two hours behind parks the run
    drive(run, ScriptedClient([reply(tool_use("delete_account", {"user": "bob"}))]))
    assert run.state == "awaiting_approval"
    deadline = run.tool_calls.get().approval_deadline
    assert deadline is not None
    left = deadline - store.database_now()
    assert timedelta(minutes=55) < left < timedelta(minutes=65), left  # not gone already
