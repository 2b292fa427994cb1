"""resume_run and deadlines: an agent's own time limit starts over when a resumed run had
passed it; a one-off deadline given to start_run is dropped."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_agentrun import Agent, SideEffect, resume_run, start_run, tool
from django_agentrun.models import Run
from django_agentrun.recovery import reap

pytestmark = pytest.mark.django_db


@tool(side_effect=SideEffect.READ_ONLY)
def noop() -> str:
    """Do nothing."""
    return "ok"


Agent(name="limited", model="claude-sonnet-4-6", tools=[noop], deadline=timedelta(minutes=10))


def _timed_out(run: Run) -> Run:
    Run.objects.filter(pk=run.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    reap(run_ids=[run.pk])
    run.refresh_from_db()
    assert run.state == "timed_out"
    return run


def test_resume__the_agents_deadline_starts_over():
    run = start_run("limited", "go")
    assert run.config["deadline_seconds"] == 600
    _timed_out(run)
    before = timezone.now()
    resume_run(run)
    run.refresh_from_db()
    assert run.state == "queued"
    assert run.deadline is not None
    assert before + timedelta(minutes=10) <= run.deadline <= timezone.now() + timedelta(minutes=10)


def test_resume__a_one_off_deadline_is_dropped():
    run = start_run("test-agent", "go", deadline=timedelta(minutes=5))
    _timed_out(run)
    resume_run(run)
    run.refresh_from_db()
    assert run.state == "queued" and run.deadline is None


def test_resume__a_run_snapshotted_before_deadline_seconds_uses_the_agent():
    run = start_run("limited", "go")
    config = {k: v for k, v in run.config.items() if k != "deadline_seconds"}
    Run.objects.filter(pk=run.pk).update(config=config)
    _timed_out(run)
    resume_run(run)
    run.refresh_from_db()
    assert run.deadline is not None and run.deadline > timezone.now() + timedelta(minutes=9)
