"""Child processes of tool handlers (`ctx.run_subprocess`), and what a lease holder's
death means for them.

A child runs in a process group of its own and carries its lease holder's identity in its
environment (`AGENTRUN_LEASE_HOLDER`), which its own children inherit. So, on Linux:

- it is killed when the thread that started it dies (`PR_SET_PDEATHSIG`): a SIGKILLed
  worker takes its direct children with it;
- a worker that ends itself because its lease runs out (the heartbeat's watchdog) kills
  the groups of the children it started first (`kill_started`);
- before a worker on the same machine takes over the lease of a holder that died, it kills
  whatever still carries that holder's identity (grandchildren included) and waits until
  they are gone (`kill_marked`): the call is recovered only once nothing of the dead
  holder can still have an effect.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HOLDER_ENV = "AGENTRUN_LEASE_HOLDER"
_PR_SET_PDEATHSIG = 1

_started: set[int] = set()  # process groups of live children started by this process
_lock = threading.Lock()


def _libc() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # not Linux: no parent-death signal
        return None


_LIBC = _libc()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child, before exec
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(args: Sequence[str], holder: str, **kwargs: Any) -> subprocess.Popen:
    """Start `args` in a process group of its own, marked with `holder`, killed with the
    thread that starts it."""
    env = dict(kwargs.pop("env", None) or os.environ)
    if holder:
        env[HOLDER_ENV] = holder
    proc = subprocess.Popen(
        list(args),
        process_group=0,
        env=env,
        preexec_fn=_die_with_parent if _LIBC is not None else None,  # noqa: PLW1509
        **kwargs,
    )
    with _lock:
        _started.add(proc.pid)
    return proc


def forget(proc: subprocess.Popen) -> None:
    """`proc` (and its group) ended or was killed."""
    with _lock:
        _started.discard(proc.pid)


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_started() -> None:
    """SIGKILL the process group of every child this process started and that may live."""
    with _lock:
        groups = list(_started)
        _started.clear()
    for pgid in groups:
        kill_group(pgid)


def marked(holder: str) -> list[int]:
    """Pids of this machine's processes (this PID namespace) that carry `holder`."""
    needle = f"{HOLDER_ENV}={holder}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def kill_marked(holder: str, *, timeout: float = 5.0) -> bool:
    """Kill every process that carries `holder` (by process group, so that what they started
    goes too) and wait until none is left; whether none is."""
    deadline = time.monotonic() + timeout
    while True:
        pids = marked(holder)
        if not pids:
            return True
        if time.monotonic() > deadline:
            return False
        own = os.getpgrp()
        for pid in pids:
            try:
                pgid = os.getpgid(pid)
            except ProcessLookupError:
                continue
            if pgid != own:
                kill_group(pgid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
