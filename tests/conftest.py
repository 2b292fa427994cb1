"""Shared fixtures: the scripted model client, projection checks, the figures report,
the Postgres tiers' database, a local Messages API server, a broker kept away.

Tests live in tiers by what they need (the Makefile picks tiers per database run):
`tests/pure` no database, `tests/db` a database (SQLite or Postgres), `tests/postgres`
Postgres only, `tests/workers` real Celery worker processes on Postgres and Redis,
`tests/browser` the admin in headless Chromium against a live server on Postgres.
Builders of typical runs (parked, failed, expired...) are in `tests/factories.py`.
"""

from __future__ import annotations

import gc
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from django_agentrun.clients import reset_model_client_cache
from django_agentrun.engine.projection import project
from django_agentrun.models import Conversation, Run, RunEvent
from django_agentrun.testing.messages_api import MessagesAPIServer

TIERS = ("pure", "db", "postgres", "workers", "browser")

_FIGURES = pytest.StashKey[list[str]]()


@pytest.fixture
def figures(request) -> Callable[[str], None]:
    """Record a measured figure (a query budget, a recovery time) for the report that
    follows the test run, instead of printing it between pytest's dots."""
    lines = request.config.stash.setdefault(_FIGURES, [])
    return lines.append


def pytest_collection_modifyitems(config, items):
    """A test module lives in a tier; one in `tests/pure` may not touch a database."""
    for item in items:
        parts = item.path.relative_to(config.rootpath).parts
        tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else None
        if tier not in TIERS:
            raise pytest.UsageError(
                f"{item.nodeid}: a test module belongs in tests/<{'|'.join(TIERS)}>"
            )
        if tier == "pure" and (
            item.get_closest_marker("django_db")
            or set(getattr(item, "fixturenames", ())) & set(_DB_FIXTURES)
        ):
            raise pytest.UsageError(f"{item.nodeid}: uses a database; move it to tests/db")


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


@pytest.fixture(autouse=True, scope="module")
def _collect_the_modules_cycles():
    """Garbage in reference cycles (an exception's traceback and the frames it holds, with a
    connection in them) is freed when the collector runs, at whatever allocation: a socket
    left open there warns in that test, which fails (filterwarnings = error) although it
    leaked nothing. Collected at the end of each module, a leak fails in its own module."""
    yield
    gc.collect()


_DB_FIXTURES = ("transactional_db", "db", "postgres", "live_server")


# Behind a connection pooler (tests/settings.py, `make test-pgbouncer`) the test database is
# created and dropped on the direct port: a pooler keeps server connections to it open,
# which DROP DATABASE refuses. The tests themselves connect through the pooler.
@pytest.fixture(scope="session")
def _setup_port(django_test_environment):
    from django.conf import settings

    port = getattr(settings, "AGENTRUN_TEST_SETUP_PORT", None)
    pooled = connection.settings_dict["PORT"]
    if port:
        _connect_to(port)
    return port, pooled


@pytest.fixture(scope="session")
def django_db_setup(_setup_port, django_db_setup, django_db_blocker):
    port, pooled = _setup_port
    if not port:
        yield
        return
    _connect_to(pooled)
    yield
    _connect_to(port)
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            [connection.settings_dict["NAME"]],
        )
    connection.close()


def _connect_to(port) -> None:
    from django.db import connections

    for conn in connections.all():
        conn.close()
        if hasattr(conn, "close_pool"):
            conn.close_pool()
        conn.settings_dict["PORT"] = port


@pytest.fixture
def postgres(transactional_db):
    """The Postgres test database's name (what worker subprocesses connect to); the
    Postgres-only tiers skip elsewhere."""
    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (set DATABASE_URL)")
    return connection.settings_dict["NAME"]


@pytest.fixture
def queue(settings) -> str:
    """A queue of this test's own, so leftovers of other tests never reach its workers."""
    name = f"agentrun-test-{uuid.uuid4().hex[:8]}"
    settings.AGENTRUN_QUEUE = name
    return name


@pytest.fixture
def test_log(tmp_path, monkeypatch) -> Path:
    """The file the test tools append to (one line per execution), in every process."""
    path = tmp_path / "executions.jsonl"
    monkeypatch.setenv("AGENTRUN_TEST_LOG", str(path))
    return path


@pytest.fixture
def messages_api() -> Iterator[MessagesAPIServer]:
    with MessagesAPIServer() as server:
        yield server


@pytest.fixture
def own_redis():
    """A redis-server of this test's own (the broker's and the streams' stay where they
    are), which the test may kill and start again (empty); killed after it if alive."""
    import shutil
    import subprocess
    import time

    import redis

    from django_agentrun.testing.processes import free_port

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("needs redis-server")
    port = free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]

    class Own:
        url = f"redis://127.0.0.1:{port}/0"
        proc: subprocess.Popen | None = None

        def start(self) -> None:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
            client = redis.Redis.from_url(self.url)
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    assert time.monotonic() < deadline, "redis-server did not start"
                    time.sleep(0.05)

        def kill(self) -> None:
            assert self.proc is not None and self.proc.poll() is None
            self.proc.kill()
            self.proc.wait()

    own = Own()
    own.start()
    yield own
    if own.proc is not None and own.proc.poll() is None:
        own.kill()


STREAM_REDIS_DB = 13  # the live streams' Redis db in tests (the broker's is 9)


@pytest.fixture
def stream_redis(settings) -> Iterator[str]:
    """Live streams on Redis db 13 under a key prefix of this test's own (removed after);
    the URL. Skips where no Redis answers."""
    import os

    import redis

    url = f"{os.environ.get('AGENTRUN_TEST_REDIS', 'redis://127.0.0.1:6379').rstrip('/')}/{STREAM_REDIS_DB}"
    server = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        server.ping()
    except redis.RedisError:
        pytest.skip(f"needs Redis at {url}")
    prefix = f"agentrun-test-{uuid.uuid4().hex[:10]}:stream"
    settings.AGENTRUN_STREAM_URL = url
    settings.AGENTRUN_STREAM_PREFIX = prefix
    yield url
    keys = list(server.scan_iter(f"{prefix}:*"))
    if keys:
        server.delete(*keys)
    server.close()


@pytest.fixture
def no_broker(monkeypatch) -> list[str]:
    """Record the wake-ups (run ids, in order) instead of publishing them: for tests whose
    commits run on_commit callbacks but need no worker. Safe from several threads."""
    from django_agentrun import tasks

    sent: list[str] = []
    lock = threading.Lock()

    def record(*args, **kwargs):
        with lock:
            sent.append(str(kwargs.get("args", args)[0]))

    monkeypatch.setattr(tasks.advance_run, "apply_async", record)
    return sent


def _database_first(request) -> bool:
    """Set the test's database up before the calling fixture's own work (so the teardown
    after its `yield` runs before the database is rolled back or flushed); False for a
    test without one."""
    names = request.fixturenames
    marker = request.node.get_closest_marker("django_db")
    if not (marker or any(n in names for n in _DB_FIXTURES)):
        return False
    transactional = (
        "transactional_db" in names
        or "postgres" in names
        or (marker is not None and marker.kwargs.get("transaction"))
    )
    request.getfixturevalue("transactional_db" if transactional else "db")
    return True


@pytest.fixture(autouse=True)
def _every_run_projects(request):
    """Invariant 7 on every run any test creates: the events alone rebuild the rows."""
    if request.node.get_closest_marker("no_projection_check") or not _database_first(request):
        yield
        return
    yield
    for run in Run.objects.all():
        assert_projection_matches(run)
    for conversation in Conversation.objects.all():
        assert_conversation_projection_matches(conversation)


@pytest.fixture(autouse=True)
def _every_run_phase_matches(request):
    """Run.phase is the reaper's class of the run's state (states.RUN_PHASE) on every run
    any test leaves, whatever wrote it (the ORM, the store's statements, the write
    function, bulk updates, the admin): on Postgres a trigger keeps it (migration
    0019_run_phase), on SQLite it is a generated column."""
    if not _database_first(request):
        yield
        return
    yield
    assert_phases_match()


def assert_phases_match() -> None:
    """Every run's phase is its state's (read straight from the table)."""
    from django_agentrun.states import RUN_PHASE

    with connection.cursor() as cursor:
        cursor.execute('SELECT "id", "state", "phase" FROM "agentrun_run"')
        wrong = [row for row in cursor.fetchall() if RUN_PHASE.get(row[1]) != row[2]]
    assert not wrong, f"runs whose phase is not their state's: {wrong[:5]}"


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


def drive_last(run: Run, client, limit: int = 30) -> str:
    """`drive`, and the last outcome."""
    return drive(run, client, limit)[-1]


def assert_api_error(response, status: int, code: str) -> dict:
    """The API's one error shape: JSON {"code", "detail"} (and "errors" for field errors)."""
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"] == "application/json", response["Content-Type"]
    body = response.json()
    assert body["code"] == code, body
    assert isinstance(body["detail"], str) and body["detail"], body
    assert set(body) <= {"code", "detail", "errors"}, body
    return body


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
            t.stop_reason,
        )
        for t in turns
    ]
    assert proj.messages == build_messages(run.input, records, context=run.context)
    assert (proj.conversation, proj.position, proj.context, proj.rolled_back) == (
        str(run.conversation_id) if run.conversation_id else None,
        run.conversation_position,
        run.context,
        run.rolled_back,
    )


def conversation_history(run: Run) -> list[dict]:
    """The history a run of a conversation sends when it starts, built from the rows the
    way the engine builds it (the earlier runs read at its claim, then its input)."""
    from django_agentrun import store
    from django_agentrun.engine.history import build_messages
    from django_agentrun.engine.step import Step

    step = Step(run.pk, "test", None, None)
    step.load_earlier(store.earlier_history(run))
    return build_messages(run.input, [], context=run.context, earlier=step.earlier)


def assert_conversation_projection_matches(conversation) -> None:
    """Every run of the conversation (but a rolled-back one) starts from the history the
    events of the runs up to it rebuild (projection.project_conversation)."""
    from django_agentrun.engine.projection import project_conversation

    runs = list(conversation.runs.order_by("conversation_position"))
    events = {r.pk: list(RunEvent.objects.filter(run=r).order_by("seq")) for r in runs}
    for n, run in enumerate(runs):
        if run.rolled_back:
            continue
        upto = [events[r.pk] for r in runs[:n]]
        mine = [e for e in events[run.pk] if e.type == "run_created"]
        assert project_conversation([*upto, mine]) == conversation_history(run), run.pk
