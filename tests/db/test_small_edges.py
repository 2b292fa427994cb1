"""Small edges of issue 25: a fork keeps the run's context, a fork's refusal offers only
turns it accepts, a cancelled call that had started says it may have had its effect, and
reconcile_runs names an unknown run and a lease that still holds."""

from __future__ import annotations

import io
import re
import uuid
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_agentrun import cancel_run, fork_run, start_run
from django_agentrun.exceptions import InvalidInput
from django_agentrun.models import Run
from django_agentrun.testing import reply, text
from tests import factories
from tests.conftest import drive

pytestmark = pytest.mark.django_db


def test_fork__keeps_the_runs_context(test_log):
    run = start_run("test-agent", "Tell Ann about order 42.", context="Today is Friday.")
    drive(run, factories.conversation_script())
    fork = fork_run(run, at_turn=2)
    assert fork.context == "Today is Friday."


def test_fork__a_turn_out_of_range_is_refused_with_turns_it_accepts(test_log):
    run, _ = factories.conversation()  # 4 turns; the last answered for good
    with pytest.raises(InvalidInput) as info:
        fork_run(run, at_turn=9)
    offered = re.findall(r"\d+", str(info.value).partition("fork from turn")[2])
    assert offered, str(info.value)
    last = int(offered[-1])
    fork_run(run, at_turn=last)  # the last turn offered is accepted


def test_unknown_outcome_cancelled__says_the_tool_may_have_had_its_effect(monkeypatch):
    run, call, _ = factories.unknown(monkeypatch)
    cancel_run(run, reason="customer left")
    call.refresh_from_db()
    assert call.state == "cancelled" and "may have run and had its effect" in call.result


def test_reconcile_runs__an_unknown_run_id_is_an_error():
    missing = uuid.uuid4()
    with pytest.raises(CommandError, match=f"No run with id {missing}"):
        call_command("reconcile_runs", "--run", str(missing), stdout=io.StringIO())


def test_reconcile_runs__a_live_lease_says_when_the_reaper_takes_it_back(monkeypatch):
    run = factories.crashed_at(monkeypatch, "model.before_commit", [reply(text("lost"))])
    until = timezone.now() + timedelta(seconds=25)  # a dead worker's lease, still live
    Run.objects.filter(pk=run.pk).update(lease_owner=factories.ELSEWHERE, lease_expires_at=until)
    out = io.StringIO()
    call_command("reconcile_runs", "--run", str(run.pk), stdout=out)
    printed = out.getvalue()
    assert f"Run {run.pk} is leased by {factories.ELSEWHERE} until" in printed, printed
    assert "the reaper takes it back after that" in printed
    assert re.search(r"\((2[0-5]) s\)", printed), printed
