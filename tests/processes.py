"""Real processes for the tests that need them, through the shipped process manager
(django_agentrun.testing.processes): Celery workers on Redis against the Postgres test
database (started and SIGKILLed by `Workers`), uvicorn (`ASGIServer`), and the waits.

Workers start warm (a spare with the slow imports done becomes the worker: about a second
instead of two and a half); AGENTRUN_TEST_COLD_WORKERS=1 starts each from scratch."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from django_agentrun.testing import processes
from django_agentrun.testing.messages_api import MessagesAPIServer
from django_agentrun.testing.processes import (
    WORKER_IMPORTS,
    Process,
    Processes,
    Server,
    Spares,
    free_port,
)

__all__ = ["ROOT", "REDIS_URL", "ASGIServer", "Workers", "free_port", "wait_for", "wait_resting"]

ROOT = Path(__file__).resolve().parents[1]
# The Redis server of the worker tier (db 9; the fresh-project test uses db 11).
REDIS_URL = os.environ.get("AGENTRUN_TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/")
_SPARES: list[Spares] = []  # one set of spares for the session


def spares() -> Spares | None:
    if os.environ.get("AGENTRUN_TEST_COLD_WORKERS"):
        return None
    if not _SPARES:
        _SPARES.append(Spares(WORKER_IMPORTS, cwd=ROOT))
    return _SPARES[0]


class Workers:
    """Start and kill real `celery worker` processes for one test."""

    def __init__(
        self, db_name: str, queue: str, api: MessagesAPIServer | None, log: Path, tmp: Path
    ):
        self.db_name = db_name
        self.queue = queue
        self.api = api
        self.log = log
        self.tmp = tmp
        self.group = Processes(tmp, cwd=ROOT, drop_env=["AGENTRUN_FAILPOINTS"], spares=spares())

    @property
    def procs(self) -> list[Process]:
        return self.group.procs

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "AGENTRUN_TEST_DB_NAME": self.db_name,
            "AGENTRUN_QUEUE": self.queue,
            "AGENTRUN_TEST_LOG": str(self.log),
            "AGENTRUN_TEST_BROKER_URL": os.environ.get(
                "AGENTRUN_TEST_BROKER_URL", f"{REDIS_URL}/9"
            ),
            "AGENTRUN_LOG_LEVEL": "INFO",
        }
        if self.api is not None:
            env.update(
                AGENTRUN_MODEL_CLIENT="django_agentrun.clients.anthropic.AnthropicModelClient",
                ANTHROPIC_BASE_URL=self.api.base_url,
                ANTHROPIC_API_KEY="test-key",
            )
        return self.group.env(**{**env, **extra})

    def start(
        self,
        *,
        pool: str = "solo",
        concurrency: int = 1,
        failpoints: str = "",
        prefix: tuple[str, ...] = (),
        **extra: str,
    ) -> Process:
        """A worker; `prefix` goes before its command line (e.g. to start it in another
        PID namespace)."""
        env = self.env(**extra)
        if failpoints:
            env["AGENTRUN_FAILPOINTS"] = failpoints
        return self.group.worker(
            "example_project",
            self.queue,
            name=f"worker{len(self.procs) + 1}",
            pool=pool,
            concurrency=concurrency,
            env=env,
            prefix=prefix,
        )

    def kill(self, proc: Process) -> None:
        """SIGKILL the worker and every process of its group (a power cut)."""
        proc.kill()

    def wait_exit(self, proc: Process, timeout: float = 30) -> int:
        return proc.wait(timeout=timeout)

    def logs(self) -> str:
        return self.group.logs()

    def stop_all(self) -> None:
        """After the test: SIGKILL every worker's group at once, then reap them. The test has
        asserted what it wanted; a warm shutdown (seconds per worker) would only cost time,
        and a killed worker is what the engine is made to survive."""
        self.group.kill_all()
        self.group.close()


def wait_for(
    predicate: Callable[[], object], timeout: float = 30, interval: float = 0.1, message: str = ""
) -> object:
    """Poll `predicate` until it returns something true (returned): the shipped wait."""
    return processes.wait_for(predicate, timeout=timeout, interval=interval, message=message)


# Where a run rests: nothing more happens without a person or a new command.
RESTING = {"completed", "failed", "cancelled", "timed_out", "awaiting_approval"}


def wait_resting(
    run, timeout: float = 40, interval: float = 0.1, before: Callable[[], object] | None = None
) -> None:
    """Wait until `run` rests (`before` runs ahead of each look, e.g. a reaper pass). The
    `workers` fixture prints the workers' logs when the test fails."""

    def resting() -> bool:
        if before is not None:
            before()
        run.refresh_from_db()
        return run.state in RESTING

    wait_for(resting, timeout=timeout, interval=interval, message=f"run {run.pk} to rest")


class ASGIServer:
    """The example project under uvicorn (one process), against the test database: the
    live streams (and the whole API) as they are served."""

    def __init__(self, workers: Workers, log: Path, **extra: str) -> None:
        self.log = log
        # The worker's environment (the test database, its queue, the streams' Redis).
        self.server: Server = workers.group.uvicorn(
            "example_project.asgi:application",
            name=log.stem,
            log=log,
            env=workers.env(**extra),
            ready_path="/api/agentrun/schema/",  # it answers (403 without credentials)
        )
        self.proc = self.server.proc
        self.port, self.url = self.server.port, self.server.url

    def stop(self) -> None:
        self.server.stop(grace=10)
