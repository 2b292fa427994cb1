"""Real processes for the tests that need them: Celery workers on Redis against the
Postgres test database (started and SIGKILLed by `Workers`), and `wait_for`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from django_agentrun.testing.messages_api import MessagesAPIServer
from tests.worker_process import celery_worker_argv

ROOT = Path(__file__).resolve().parents[1]
# The Redis server of the worker tier (db 9; the fresh-project test uses db 11).
REDIS_URL = os.environ.get("AGENTRUN_TEST_REDIS", "redis://127.0.0.1:6379").rstrip("/")


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
        self.procs: list[subprocess.Popen] = []
        self.count = 0

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "AGENTRUN_TEST_DB_NAME": self.db_name,
            "AGENTRUN_QUEUE": self.queue,
            "AGENTRUN_TEST_LOG": str(self.log),
            "AGENTRUN_TEST_BROKER_URL": os.environ.get(
                "AGENTRUN_TEST_BROKER_URL", f"{REDIS_URL}/9"
            ),
            "AGENTRUN_LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("AGENTRUN_FAILPOINTS", None)
        if self.api is not None:
            env.update(
                AGENTRUN_MODEL_CLIENT="django_agentrun.clients.anthropic.AnthropicModelClient",
                ANTHROPIC_BASE_URL=self.api.base_url,
                ANTHROPIC_API_KEY="test-key",
            )
        env.update(extra)
        return env

    def start(
        self,
        *,
        pool: str = "solo",
        concurrency: int = 1,
        failpoints: str = "",
        prefix: tuple[str, ...] = (),
        **extra: str,
    ) -> subprocess.Popen:
        """A worker; `prefix` goes before its command line (e.g. to start it in another
        PID namespace)."""
        self.count += 1
        name = f"w{self.count}-{self.queue}@%h"
        env = self.env(**extra)
        if failpoints:
            env["AGENTRUN_FAILPOINTS"] = failpoints
        with open(self.tmp / f"worker{self.count}.log", "wb") as out:
            proc = subprocess.Popen(
                [
                    *prefix,
                    *celery_worker_argv(self.queue, name, pool=pool, concurrency=concurrency),
                ],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc.log_path = self.tmp / f"worker{self.count}.log"  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen) -> None:
        """SIGKILL the worker and every process of its group (a power cut)."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)

    def wait_exit(self, proc: subprocess.Popen, timeout: float = 30) -> int:
        return proc.wait(timeout=timeout)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.log_path.name} ---\n{p.log_path.read_text(errors='replace')[-4000:]}"  # type: ignore[attr-defined]
            for p in self.procs
        )

    def stop_all(self) -> None:
        """After the test: SIGKILL every worker's group at once, then reap them. The test has
        asserted what it wanted; a warm shutdown (seconds per worker) would only cost time,
        and a killed worker is what the engine is made to survive."""
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            proc.wait(timeout=10)


def wait_for(
    predicate: Callable[[], object], timeout: float = 30, interval: float = 0.1, message: str = ""
) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate}")
        time.sleep(interval)


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


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ASGIServer:
    """The example project under uvicorn (one process), against the test database: the
    live streams (and the whole API) as they are served."""

    def __init__(self, workers: Workers, log: Path, **extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        # The worker's environment (the test database, its queue, the streams' Redis).
        env = workers.env(**extra)
        with open(log, "wb") as out:
            self.proc = self._start(env, out)
        wait_for(self._answers, timeout=30, message=f"uvicorn on {self.url} ({log})")

    def _start(self, env: dict[str, str], out) -> subprocess.Popen:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "example_project.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _answers(self) -> bool:
        import urllib.error
        import urllib.request

        if self.proc.poll() is not None:
            raise AssertionError(f"uvicorn exited: {self.log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(f"{self.url}/api/agentrun/schema/", timeout=1)
        except urllib.error.HTTPError:
            return True  # it answers (403 without credentials)
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
