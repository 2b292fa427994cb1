"""Real Celery worker processes for the bench, a reaper loop, and cleanup on exit.

Workers run `python -m celery -A example_project worker` from the repo root with
DJANGO_SETTINGS_MODULE=bench.settings, the bench database, a Redis db of the
bench's own (BENCH_BROKER_URL, default db 12) and a queue name unique to this
bench invocation and section, started and stopped by the shipped process manager
(django_agentrun.testing.processes; cold starts: the figures count a worker's start).
Each worker is its own session (process group), so a kill takes the whole worker, pool
children included.
"""

from __future__ import annotations

import atexit
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django_agentrun.testing.processes import Process, Processes

from .common import ROOT, RUN_ID

LOG_DIR = Path(tempfile.gettempdir()) / f"agentrun-bench-{RUN_ID}"
_pools: list[Workers] = []
_child_markers: list[bytes] = []  # cmdlines of tool children to kill on exit (b"sleep\0...")


class Worker(Process):
    """A worker process; `log` is its log file."""

    @property
    def log(self) -> Path:
        return self.log_path

    def pids(self) -> set[int]:
        """The worker's process group: the main process and its pool children."""
        found = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.getpgid(int(entry.name)) == self.pid:
                        found.add(int(entry.name))
                except (ProcessLookupError, PermissionError):
                    pass
        return found


class Workers:
    """Worker processes of one bench section, all consuming one queue of their own."""

    def __init__(self, label: str, **env: str) -> None:
        self.queue = f"agentrun-bench-{RUN_ID}-{label}"
        self.label = label
        self.group = Processes(
            LOG_DIR,
            cwd=ROOT,
            drop_env=("AGENTRUN_FAILPOINTS", "AGENTRUN_TEST_LOG"),
            env={
                "DJANGO_SETTINGS_MODULE": "bench.settings",
                "AGENTRUN_QUEUE": self.queue,
                "AGENTRUN_LOG_LEVEL": "INFO",
                **env,
            },
        )
        self.workers: list[Worker] = []
        _pools.append(self)

    def env(self, **extra: str) -> dict[str, str]:
        return self.group.env(**extra)

    def start(
        self, *, pool: str = "solo", concurrency: int = 1, wait: bool = True, **extra: str
    ) -> Worker:
        child = self.group.worker(
            "example_project",
            self.queue,
            name=f"{self.label}-worker{len(self.workers) + 1}",
            pool=pool,
            concurrency=concurrency,
            env=self.env(**extra),
            ready=wait,
        )
        worker = Worker(child.name, child.proc, child.log_path, child.args)
        self.workers.append(worker)
        return worker

    def kill(self, worker: Worker) -> None:
        """SIGKILL the whole worker (its process group), as a power cut would."""
        worker.kill()

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.stop(grace=5)

    def tail(self, worker: Worker, chars: int = 3000) -> str:
        return worker.tail(chars)

    def logs(self) -> str:
        return "\n".join(self.tail(w) for w in self.workers)

    @contextmanager
    def active(self) -> Iterator[Workers]:
        """Point this process's enqueues (start_run, the reaper) at this pool's queue."""
        from django.conf import settings

        old = getattr(settings, "AGENTRUN_QUEUE", None)
        settings.AGENTRUN_QUEUE = self.queue
        try:
            yield self
        finally:
            settings.AGENTRUN_QUEUE = old
            self.stop_all()


class Reaper(threading.Thread):
    """The bench's stand-in for celery beat: `recovery.reap()` every `interval` seconds,
    limited to the bench's own runs (so it never touches other rows of the database)."""

    def __init__(self, interval: float, run_ids: set[Any]) -> None:
        super().__init__(name="bench-reaper", daemon=True)
        self.interval = interval
        self.run_ids = run_ids
        self._halt = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        from django.db import connection

        from django_agentrun.recovery import reap

        try:
            while not self._halt.wait(self.interval):
                try:
                    if self.run_ids:
                        reap(run_ids=list(self.run_ids))
                except Exception as exc:  # noqa: BLE001 - keep reaping
                    self.errors.append(repr(exc))
        finally:
            connection.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


# --------------------------------------------------------------------------- children, cleanup


def register_child(args: list[str]) -> bytes:
    marker = b"\0".join(a.encode() for a in args) + b"\0"
    _child_markers.append(marker)
    return marker


def find_processes(marker: bytes) -> list[int]:
    """Pids whose command line is exactly `marker` (NUL-separated, as in /proc/PID/cmdline)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "cmdline").read_bytes() == marker:
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def _purge_redis(queues: list[str]) -> None:
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        for queue in queues:
            for key in client.scan_iter(match=f"{queue}*"):
                client.delete(key)
            client.delete(f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
        # Messages of killed workers wait in `unacked` for the visibility timeout: drop ours.
        for tag, payload in client.hgetall("unacked").items():
            if any(q.encode() in payload for q in queues):
                client.hdel("unacked", tag)
                client.zrem("unacked_index", tag)
    finally:
        client.close()


def cleanup() -> None:
    """Stop every worker this process started, kill leftover tool children, purge our queues."""
    while _pools:
        pool = _pools.pop()
        pool.stop_all()
        queues = [pool.queue]
        try:
            _purge_redis(queues)
        except Exception:  # noqa: BLE001 - best effort (Redis may be down)
            pass
    for marker in _child_markers:
        for pid in find_processes(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


atexit.register(cleanup)
signal.signal(signal.SIGTERM, _on_signal)
