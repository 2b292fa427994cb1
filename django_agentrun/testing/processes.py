"""Child processes for tests, benchmarks and demos: Celery workers and beat, uvicorn and
runserver, each in a session of its own (a signal reaches its whole process group: pool
children, tool subprocesses), its output in a log file, waited for until it is ready,
stopped (SIGTERM, then SIGKILL after a grace) or killed (SIGKILL: a power cut), and all
stopped when the parent exits.

    procs = Processes(log_dir, cwd=BASE_DIR, env={"DJANGO_SETTINGS_MODULE": ...})
    worker = procs.worker("example_project", "my-queue", ready=True)
    server = procs.uvicorn("example_project.asgi:application", ready_path="/admin/")
    procs.kill(worker)   # the worker and its pool children, at once
    procs.stop_all()     # what still runs: SIGTERM, SIGKILL after `grace`

Warm starts (`Processes(..., spares=Spares())`, spares.py): a worker ready in about a
second instead of two and a half, from a process started ahead of time with the slow
imports done; the same real process, killed the same way.

Standard library only; it imports nothing of the app, so a project's own tests, the
benchmark and the example project's commands can all use it.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

from .spares import WORKER_IMPORTS, Spares, die_with_parent

__all__ = [
    "WORKER_IMPORTS",
    "Process",
    "Processes",
    "Server",
    "Spares",
    "celery_worker_argv",
    "free_port",
    "http_answers",
    "wait_for",
]

_LIVE: list[Processes] = []  # stopped at exit


def wait_for(
    predicate: Callable[[], object], timeout: float = 30, interval: float = 0.1, message: str = ""
) -> object:
    """Poll `predicate` until it returns something true (returned); AssertionError after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def http_answers(url: str) -> bool:
    """Whether an HTTP server answers at `url` (any status: a 403 is an answer)."""
    try:
        urllib.request.urlopen(url, timeout=1).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def celery_worker_argv(
    app: str,
    queue: str,
    name: str,
    *,
    pool: str = "solo",
    concurrency: int = 1,
    loglevel: str = "info",
    python: str = sys.executable,
) -> list[str]:
    """A worker on one queue only, without gossip, mingle and heartbeat (a fast start, no
    chatter between workers)."""
    return [
        *(python, "-m", "celery", "-A", app, "worker", f"--pool={pool}"),
        *(f"--concurrency={concurrency}", "-Q", queue, "-n", name),
        *("--without-gossip", "--without-mingle", "--without-heartbeat", "-l", loglevel),
    ]


class Process:
    """One started child: `pid`, `poll()`, `wait()`, `returncode` as `Popen` has them, its
    `name` and its log file (`log_path`, `log_text()`, `tail()`)."""

    def __init__(
        self, name: str, proc: subprocess.Popen, log_path: Path | None, argv: list[str]
    ) -> None:
        self.name, self.proc, self.log_path, self.args = name, proc, log_path, argv

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout=timeout)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """`sig` to the whole process group (the child is a session of its own)."""
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """SIGKILL the child and every process of its group (a power cut); reap it."""
        self.signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM (a warm shutdown), SIGKILL after `grace` seconds."""
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_text(self) -> str:
        """Its output so far ("" when it writes to this process's own output)."""
        path = self.log_path
        return path.read_text(errors="replace") if path and path.exists() else ""

    def tail(self, chars: int = 4000) -> str:
        return f"--- {self.name} ({self.log_path}) ---\n{self.log_text()[-chars:]}"

    def wait_ready(self, ready: Callable[[], object], timeout: float = 60) -> None:
        """Until `ready()`; RuntimeError if the child exits first or the time runs out."""

        def check() -> object:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited ({self.returncode}):\n{self.tail()}")
            return ready()

        try:
            wait_for(check, timeout=timeout, interval=0.05, message=self.name)
        except AssertionError as exc:
            raise RuntimeError(f"{exc}\n{self.tail()}") from None

    def wait_log(self, text: str, timeout: float = 60) -> None:
        self.wait_ready(lambda: text in self.log_text(), timeout=timeout)


class Server(Process):
    """A child serving HTTP on `port` (`url`)."""

    port: int
    url: str


class Processes:
    """Children started for one test, bench section or demo, with their logs in `log_dir`
    (None: they write to this process's output): started with `env` (the parent's
    environment, then `env`, then each start's own), stopped together by `stop_all()` or
    `kill_all()`, and at exit."""

    def __init__(
        self,
        log_dir: Path | None,
        *,
        cwd: Path | str | None = None,
        env: dict[str, str] | None = None,
        drop_env: Iterable[str] = (),
        spares: Spares | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.log_dir = Path(log_dir) if log_dir is not None else None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        self.cwd = Path(cwd or os.getcwd())
        self.base_env = dict(env or {})
        self.drop_env = set(drop_env)
        self.spares = spares
        # Linux: each child gets SIGKILL when this process dies, even by SIGKILL (no
        # atexit then), so none is left behind.
        self.die_with_parent = die_with_parent
        self.procs: list[Process] = []
        _LIVE.append(self)

    def env(self, **extra: str) -> dict[str, str]:
        """What a child gets: this process's environment (less `drop_env`), the group's
        `env`, then `extra`."""
        env = {k: v for k, v in os.environ.items() if k not in self.drop_env}
        return {"PYTHONUNBUFFERED": "1", **env, **self.base_env, **extra}

    def start(
        self,
        argv: list[str],
        *,
        name: str | None = None,
        env: dict[str, str] | None = None,
        log: Path | None = None,
        warm: bool = True,
        **popen: object,
    ) -> Process:
        """Start `argv` with `env` as its whole environment (default: `self.env()`), its
        output in `log` (default: <log_dir>/<name>.log)."""
        name = name or f"{Path(argv[0]).name}{len(self.procs) + 1}"
        if log is None and self.log_dir is not None:
            log = self.log_dir / f"{name}.log"
        env = self.env() if env is None else env
        warm = bool(self.spares and warm and log and not popen)
        spare = self.spares.take(argv) if warm and self.spares else None
        if spare is not None and log is not None:
            log.write_bytes(b"")  # the spare writes to it from its first line on
            proc = self.spares.give(spare, argv, env, self.cwd, log, self.die_with_parent)
        else:
            out = open(log, "wb") if log else None  # noqa: SIM115 - closed below
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=self.cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT if out else None,
                    start_new_session=True,
                    preexec_fn=die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
                    **popen,  # type: ignore[arg-type]
                )
            finally:
                if out is not None:
                    out.close()
        child = Process(name, proc, log, argv)
        self.procs.append(child)
        return child

    def worker(
        self,
        app: str,
        queue: str,
        *,
        name: str | None = None,
        pool: str = "solo",
        concurrency: int = 1,
        loglevel: str = "info",
        env: dict[str, str] | None = None,
        prefix: tuple[str, ...] = (),
        ready: bool = False,
        timeout: float = 60,
    ) -> Process:
        """A Celery worker of `app` on `queue`; `prefix` goes before its command line (e.g.
        to start it in another PID namespace); `ready` waits for its "ready." line (log
        level info or lower)."""
        name = name or f"worker{len(self.procs) + 1}"
        argv = celery_worker_argv(
            app, queue, f"{name}-{queue}@%h", pool=pool, concurrency=concurrency, loglevel=loglevel
        )
        child = self.start([*prefix, *argv], name=name, env=env, warm=not prefix)
        if ready:
            child.wait_log(" ready.", timeout=timeout)
        return child

    def beat(self, app: str, *, name: str = "beat", env: dict[str, str] | None = None) -> Process:
        """Celery beat of `app`, its schedule file in the log directory (or a temporary one)."""
        schedule = (self.log_dir or Path(tempfile.mkdtemp())) / f"{name}-schedule"
        argv = [sys.executable, "-m", "celery", "-A", app, "beat", "-s", str(schedule)]
        return self.start([*argv, "--pidfile=", "-l", "info"], name=name, env=env)

    def uvicorn(
        self,
        asgi: str,
        *,
        name: str = "uvicorn",
        port: int = 0,
        args: tuple[str, ...] = ("--log-level", "warning"),
        env: dict[str, str] | None = None,
        log: Path | None = None,
        ready_path: str | None = "/",
        timeout: float = 30,
    ) -> Server:
        """uvicorn serving `asgi` on 127.0.0.1:`port` (a free one by default); waits until
        `ready_path` answers (None: no wait)."""
        port = port or free_port()
        argv = [sys.executable, "-m", "uvicorn", asgi, "--host", "127.0.0.1", "--port", str(port)]
        child = self.start([*argv, *args], name=name, env=env, log=log)
        return self._served(child, port, ready_path, timeout)

    def runserver(
        self,
        manage: Path | str,
        *,
        name: str = "runserver",
        port: int = 0,
        env: dict[str, str] | None = None,
        ready_path: str | None = "/",
        timeout: float = 30,
    ) -> Server:
        """Django's development server (`manage.py runserver --noreload`)."""
        port = port or free_port()
        argv = [sys.executable, str(manage), "runserver", "--noreload", f"127.0.0.1:{port}"]
        child = self.start(argv, name=name, env=env)
        return self._served(child, port, ready_path, timeout)

    def _served(self, child: Process, port: int, ready_path: str | None, timeout: float) -> Server:
        server = Server(child.name, child.proc, child.log_path, child.args)
        self.procs[-1] = server
        server.port, server.url = port, f"http://127.0.0.1:{port}"
        if ready_path is not None:
            server.wait_ready(lambda: http_answers(server.url + ready_path), timeout=timeout)
        return server

    def kill(self, child: Process) -> None:
        child.kill()

    def logs(self, chars: int = 4000) -> str:
        return "\n".join(child.tail(chars) for child in self.procs)

    def kill_all(self) -> None:
        """SIGKILL every child's group at once, then reap them: a test that has asserted
        what it wanted needs no warm shutdown (seconds a worker)."""
        for child in self.procs:
            if child.alive():
                child.signal(signal.SIGKILL)
        for child in self.procs:
            child.wait(timeout=10)

    def stop_all(self, grace: float = 10.0) -> None:
        """SIGTERM every child still running, all at once; SIGKILL after `grace`."""
        alive = [child for child in self.procs if child.alive()]
        for child in alive:
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in alive:
            try:
                child.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                child.kill()

    def close(self) -> None:
        """Stop the children (SIGTERM, SIGKILL after 5 s)."""
        self.stop_all(grace=5)
        if self in _LIVE:
            _LIVE.remove(self)


@atexit.register
def _stop_everything() -> None:
    for group in list(_LIVE):
        group.close()
