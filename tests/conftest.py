"""Shared fixtures: the scripted model client, projection checks, the figures report."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from django_agentrun.clients import reset_model_client_cache
from django_agentrun.engine.projection import project
from django_agentrun.models import Run, RunEvent

_FIGURES = pytest.StashKey[list[str]]()


@pytest.fixture
def figures(request) -> Callable[[str], None]:
    """Record a measured figure (a query budget, a recovery time) for the report that
    follows the test run, instead of printing it between pytest's dots."""
    lines = request.config.stash.setdefault(_FIGURES, [])
    return lines.append


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = config.stash.get(_FIGURES, [])
    if lines:
        terminalreporter.write_sep("-", "figures")
        for line in lines:
            terminalreporter.write_line(line)


def purge_queue(queue: str) -> None:
    """Drop the messages left in `queue` (best effort: no broker, nothing to drop)."""
    from example_project.celery import app

    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=0)
            conn.default_channel.queue_purge(queue)
    except Exception:  # noqa: BLE001 - the queue (or the broker) may not exist
        pass


@pytest.fixture(autouse=True)
def _own_queue(request, settings):
    """Each test publishes its wake-ups to a queue of its own, emptied afterwards, so what
    one test leaves in the broker is never another's backlog (the reaper counts it)."""
    settings.AGENTRUN_QUEUE = f"agentrun-test-{uuid.uuid4().hex[:8]}"
    yield
    if any(name in request.fixturenames for name in ("transactional_db", "postgres")) or (
        (marker := request.node.get_closest_marker("django_db")) is not None
        and marker.kwargs.get("transaction")
    ):
        purge_queue(settings.AGENTRUN_QUEUE)


@pytest.fixture(autouse=True)
def _fresh_client_cache():
    reset_model_client_cache()
    yield
    reset_model_client_cache()


_DB_FIXTURES = ("transactional_db", "db", "postgres", "live_server")


@pytest.fixture(autouse=True)
def _every_run_projects(request):
    """Invariant 7 on every run any test creates: the events alone rebuild the rows."""
    names = request.fixturenames
    marker = request.node.get_closest_marker("django_db")
    if request.node.get_closest_marker("no_projection_check") or not (
        marker or any(n in names for n in _DB_FIXTURES)
    ):
        yield
        return
    transactional = (
        "transactional_db" in names
        or "postgres" in names
        or (marker is not None and marker.kwargs.get("transaction"))
    )
    # Set the database up first, so this teardown runs before it is rolled back or flushed.
    request.getfixturevalue("transactional_db" if transactional else "db")
    yield
    for run in Run.objects.all():
        assert_projection_matches(run)


def drive(run: Run, client, limit: int = 30) -> list[str]:
    """Advance `run` in this process until it stops continuing (parked, finished, not
    claimed); returns the outcomes, and leaves `run` refreshed."""
    from django_agentrun.engine import Outcome, advance

    outcomes: list[str] = []
    for _ in range(limit):
        outcomes.append(advance(run.pk, client=client))
        if outcomes[-1] != Outcome.CONTINUED:
            break
    run.refresh_from_db()
    return outcomes


def assert_projection_matches(run: Run) -> None:
    """The events alone rebuild the run's states, usage and history."""
    from django_agentrun.engine.history import TurnRecord, build_messages

    run.refresh_from_db()
    events = list(RunEvent.objects.filter(run=run).order_by("seq"))
    proj = project(events)
    assert proj.last_seq == run.last_seq == len(events)
    assert proj.run_state == run.state
    turns = list(run.turns.order_by("index"))
    assert proj.turn_states == {t.index: t.state for t in turns}
    calls = list(run.tool_calls.all())
    assert proj.tool_call_states == {(c.turn_index, c.tool_call_id): c.state for c in calls}
    assert proj.usage == run.usage()
    records = [
        TurnRecord(
            t.index,
            t.content,
            [
                c.tool_result_block()
                for c in sorted(t.tool_calls.all(), key=lambda c: c.position)
                if c.is_closed
            ],
        )
        for t in turns
    ]
    assert proj.messages == build_messages(run.input, records)
