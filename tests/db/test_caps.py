"""Caps on the runs worked at once (#26): AGENTRUN_MAX_RUNS_PER_KEY per fair-share key and an
Agent's max_concurrent_runs. A run over a cap is not claimed: no lease, no event, no slot
held; its wake-up is sent again for later, and a run under the cap that ends or waits for
a person wakes the one queued longest. The key is named once, when the run is created."""

from __future__ import annotations

import pytest
from django.core import checks

from django_agentrun import start_run, store
from django_agentrun.abort import AbortSignal
from django_agentrun.agents import Agent, unregister_agent
from django_agentrun.engine import Outcome, advance
from django_agentrun.engine.claim import claim
from django_agentrun.engine.step import Step
from django_agentrun.exceptions import ConfigurationError
from django_agentrun.models import Run, RunEvent
from django_agentrun.testing import ScriptedClient, reply, text
from tests import factories
from tests.conftest import drive

pytestmark = pytest.mark.django_db


@pytest.fixture
def capped_agent():
    Agent("one-at-a-time", model="claude-sonnet-4-6", max_concurrent_runs=1)
    yield "one-at-a-time"
    unregister_agent("one-at-a-time")


def worked(run: Run, owner: str = "worker-1") -> Step:
    """A worker claimed `run` and is working on it (running, a live lease); the step."""
    step = Step(run.pk, owner, AbortSignal(), None)
    assert claim(step) is not None
    run.refresh_from_db()
    assert run.state == "running" and run.lease_owner == owner
    return step


def untouched(run: Run) -> None:
    """The claim that was refused changed nothing: no lease taken, no event."""
    run.refresh_from_db()
    assert (run.state, run.lease_owner, run.lease_epoch) == ("queued", "", 0)
    assert RunEvent.objects.filter(run=run).count() == 1  # run_created


def test_agent_cap__a_run_over_it_waits_and_is_woken_when_a_slot_is_given_back(
    capped_agent, no_broker
):
    ann = factories.user("ann")
    first = start_run(capped_agent, "one", owner=ann)
    second = start_run(capped_agent, "two", owner=ann)
    other = start_run("test-agent", "three", owner=ann)  # no cap of its own
    step = worked(first)
    no_broker.clear()

    assert advance(second.pk, client=ScriptedClient([])) == Outcome.CAPPED
    untouched(second)
    assert no_broker == [str(second.pk)]  # asks again later

    assert drive(other, ScriptedClient([reply(text("ok"))])) == [Outcome.FINISHED]

    store.release_lease(step.lease)  # the worker gives its slot back (a hand-off)...
    no_broker.clear()
    assert drive(first, ScriptedClient([reply(text("done"))])) == [Outcome.FINISHED]
    assert str(second.pk) in no_broker  # ...and the run that ends wakes the queued one
    assert drive(second, ScriptedClient([reply(text("done"))])) == [Outcome.FINISHED]


def test_agent_cap__a_stale_wake_up_of_a_finished_run_is_not_capped(capped_agent, no_broker):
    ann = factories.user("ann")
    done = start_run(capped_agent, "one", owner=ann)
    drive(done, ScriptedClient([reply(text("ok"))]))
    busy = start_run(capped_agent, "two", owner=ann)
    worked(busy)
    no_broker.clear()
    assert advance(done.pk, client=ScriptedClient([])) == Outcome.NOT_CLAIMED
    assert no_broker == []  # nothing to ask again for


def test_key_cap__counts_the_runs_of_one_key_only(settings, no_broker):
    settings.AGENTRUN_MAX_RUNS_PER_KEY = 2
    ann, bob = factories.user("ann"), factories.user("bob")
    anns = [start_run("test-agent", f"a{i}", owner=ann) for i in range(3)]
    bobs = start_run("test-agent", "b", owner=bob)
    assert {r.share_key for r in anns} == {f"owner:{ann.pk}"}
    worked(anns[0], "w1")
    worked(anns[1], "w2")
    assert advance(anns[2].pk, client=ScriptedClient([])) == Outcome.CAPPED
    untouched(anns[2])
    # Bob's run is not held up behind Ann's: its key has its own count.
    assert drive(bobs, ScriptedClient([reply(text("ok"))])) == [Outcome.FINISHED]
    # A lease that ran out (a dead worker) is no longer counted as worked.
    factories.expire(Run.objects.get(pk=anns[0].pk))
    assert drive(anns[2], ScriptedClient([reply(text("ok"))])) == [Outcome.FINISHED]


def test_key_cap__the_reapers_recovery_is_never_capped(settings, no_broker):
    """Settling a dead worker's calls is the run's own work already counted: the cap does
    not hold a recovery back."""
    from django_agentrun.engine import settle_in_flight

    settings.AGENTRUN_MAX_RUNS_PER_KEY = 1
    ann = factories.user("ann")
    dead, busy = (start_run("test-agent", f"r{i}", owner=ann) for i in range(2))
    worked(dead, "dead-worker")
    factories.expire(Run.objects.get(pk=dead.pk))
    worked(busy, "w2")
    assert settle_in_flight(dead.pk) != Outcome.CAPPED
    dead.refresh_from_db()
    assert dead.lease_epoch == 2  # the reaper took the lease over


def test_share_key__named_once_when_the_run_is_created(settings):
    calls = []

    def key(run):
        calls.append(run.pk)
        return f"tenant:{run.metadata['tenant']}"

    Agent("keyed", model="claude-sonnet-4-6", fair_share_key=key)
    try:
        ann = factories.user("ann")
        run = start_run("keyed", "hi", owner=ann, metadata={"tenant": "acme"})
        assert Run.objects.get(pk=run.pk).share_key == "tenant:acme"
        client = ScriptedClient([reply(text("ok"))])
        drive(run, client)
        assert calls == [run.pk]  # not again for its request
        assert client.requests[0].admission["key"] == "tenant:acme"
        settings.AGENTRUN_FAIR_SHARE_KEY = "tests.testapp.agents.tenant_of"
        run = start_run("test-agent", "hi", owner=ann, metadata={"tenant": "acme"})
        assert run.share_key == "host:acme"
    finally:
        unregister_agent("keyed")


def test_caps__bad_settings_and_options_are_refused(settings):
    from django_agentrun.checks import check_settings

    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ConfigurationError, match="max_concurrent_runs"):
            Agent("bad", max_concurrent_runs=bad, register=False)
    settings.AGENTRUN_MAX_RUNS_PER_KEY = 0
    settings.AGENTRUN_CAPPED_RETRY_SECONDS = 0
    ids = {e.id for e in check_settings(None) if e.level >= checks.ERROR}
    assert {"agentrun.E017", "agentrun.E018"} <= ids
    settings.AGENTRUN_MAX_RUNS_PER_KEY = 3
    settings.AGENTRUN_CAPPED_RETRY_SECONDS = 0.5
    ids = {e.id for e in check_settings(None)}
    assert not {"agentrun.E017", "agentrun.E018"} & ids
