"""The worker tier: real `celery worker` processes on Redis against the Postgres test
database, a local Messages API server, processes killed with SIGKILL.

Worker subprocesses get the test database's name through the environment
(AGENTRUN_TEST_DB_NAME), so tests here use `transactional_db` (through `postgres`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import purge_queue
from tests.processes import ASGIServer, Workers

# The application name of the ASGI server's database connections (the tests count them).
APP_NAME = "agentrun-streams-test"


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/workers" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def workers(postgres, queue, test_log, tmp_path, request, settings) -> Iterator[Workers]:
    api = (
        request.getfixturevalue("messages_api") if "messages_api" in request.fixturenames else None
    )
    pool = Workers(postgres, queue, api, test_log, tmp_path)
    yield pool
    pool.stop_all()
    purge_queue(queue)
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(pool.logs())


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def asgi_server(workers, stream_redis, settings, tmp_path) -> Iterator[ASGIServer]:
    """uvicorn serving the example project, a worker started, both on the live streams' Redis
    (keep-alives every 0.5 s, a database poll every 0.2 s)."""
    extra = {
        "AGENTRUN_STREAM_URL": stream_redis,
        "AGENTRUN_STREAM_PREFIX": settings.AGENTRUN_STREAM_PREFIX,
        "AGENTRUN_STREAM_KEEPALIVE_SECONDS": "0.5",
        "AGENTRUN_STREAM_POLL_SECONDS": "0.2",
    }
    workers.start(**extra)
    # Its database connections are named, so the test can count them.
    served = ASGIServer(workers, tmp_path / "uvicorn.log", PGAPPNAME=APP_NAME, **extra)
    yield served
    served.stop()
    print(served.log.read_text()[-3000:])  # shown when the test fails
