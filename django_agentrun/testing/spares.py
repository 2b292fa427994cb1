"""Warm spares for `processes.Processes`: Python processes started ahead of time with the
slow imports of a worker done (the anthropic SDK alone takes a second), each of which
becomes the next `python -m ...` child when one is asked for. It takes that child's
environment, working directory and log before anything reads them, then runs the module
as `python -m` would: the same real process (the pid `Popen` gave; `ps` still shows the
spare's command line), killed the same way.
A spare waits at idle CPU priority (where the parent may raise it back: root on Linux),
so it never slows a running test down; it is put back to normal when it is given an order.

    python -m django_agentrun.testing.spares MODULE...   # what `Spares` starts

Standard library only; no settings are read before the order comes.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

# What a Celery worker of a project using this app spends its start-up importing.
WORKER_IMPORTS = (
    "anthropic",
    "celery.bin.celery",
    "celery.apps.worker",
    "celery.worker.consumer",
    "kombu.transport.redis",
    "django.db.models",
    "django.contrib.admin",
    "rest_framework",
)


class Spares:
    """Warm spares for `Processes.start` (see the module's docstring): `count` Python
    processes with `modules` imported, each replaced as soon as it is taken, all dismissed
    by `close()` or at exit. One `Spares` can serve many `Processes` (a whole test session)."""

    def __init__(
        self, modules: Iterable[str] = WORKER_IMPORTS, *, count: int = 2, cwd: Path | None = None
    ) -> None:
        self.modules = tuple(modules)
        self.count = count
        self.cwd = Path(cwd or os.getcwd())
        self.idle: list[subprocess.Popen] = []
        atexit.register(self.close)

    def take(self, argv: list[str]) -> subprocess.Popen | None:
        """A spare for `argv` (a `python -m` command line of this Python), or None."""
        if argv[:2] != [sys.executable, "-m"] or not self.count:
            return None
        self.fill()
        spare = self.idle.pop(0)
        self.fill()
        return spare

    def fill(self) -> None:
        self.idle = [s for s in self.idle if s.poll() is None]
        while len(self.idle) < self.count:
            spare = subprocess.Popen(
                [sys.executable, "-m", "django_agentrun.testing.spares", *self.modules],
                cwd=self.cwd,
                # No settings yet: an import that reads them fails (and is left to the child)
                # rather than caching the parent's.
                env={**os.environ, "PYTHONUNBUFFERED": "1", "DJANGO_SETTINGS_MODULE": ""},
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            _priority(spare.pid, idle=True)
            self.idle.append(spare)

    def give(
        self,
        spare: subprocess.Popen,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        log: Path,
        die: bool = False,
    ) -> subprocess.Popen:
        """Turn `spare` into `argv` with `env`, in `cwd`, its output in `log`."""
        # Its normal priority first: threads it starts inherit the priority of the moment.
        _priority(spare.pid, idle=False)
        order = {"argv": argv[1:], "env": env, "cwd": str(cwd), "log": str(log), "die": die}
        spare.stdin.write(json.dumps(order).encode() + b"\n")  # type: ignore[union-attr]
        spare.stdin.close()  # type: ignore[union-attr]
        return spare

    def close(self) -> None:
        for spare in self.idle:
            spare.kill()
            spare.wait(timeout=10)
        self.idle.clear()


def _priority(pid: int, *, idle: bool) -> None:
    """A spare waits at idle CPU priority, and is put back to the normal one when it is
    given an order; only where this process may raise it back (root, on Linux)."""
    if not hasattr(os, "SCHED_IDLE") or os.geteuid() != 0:
        return
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE if idle else os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        pass


def die_with_parent() -> None:
    """In the child: SIGKILL when the parent dies (Linux's PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
        except (OSError, AttributeError):
            pass


def _spare(modules: list[str]) -> None:
    """A warm spare: import `modules`, wait for an order on stdin, then become that
    `python -m` child."""
    import importlib
    import runpy

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - a missing extra only costs the warm start
            continue
    line = sys.stdin.buffer.readline()
    if not line:
        return  # dismissed
    order = json.loads(line)
    if order.get("die"):
        die_with_parent()
    out = os.open(order["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(null)
    os.environ.clear()
    os.environ.update(order["env"])
    os.chdir(order["cwd"])
    sys.path[0] = order["cwd"]
    argv = order["argv"]
    assert argv[0] == "-m", argv
    sys.argv = [argv[1], *argv[2:]]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _spare(sys.argv[1:])
