"""Who holds a lease, and when a holder can be known to be dead.

A lease owner is `host:pid:nonce:boot:pidns`. The pid says something only to a process
that shares the holder's kernel boot (`/proc/sys/kernel/random/boot_id`) and PID
namespace (`/proc/self/ns/pid`): containers that share a host name (host networking,
fixed compose host names, Kubernetes hostNetwork) have PID namespaces of their own, and a
pid there names another process here, or none. So a lease is taken from a live-looking
holder early only when both match and that pid no longer exists (a killed pool child on
this machine); otherwise only its expiry, judged by the database's clock, frees it.
"""

from __future__ import annotations

import functools
import os
import socket
import uuid
from dataclasses import dataclass


@functools.cache
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip().replace("-", "")
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return ""
    return "".join(c for c in link if c.isdigit())


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int | None
    boot: str
    pidns: str

    @classmethod
    def parse(cls, owner: str) -> Holder:
        parts = owner.split(":")
        pid = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        boot = parts[3] if len(parts) > 4 else ""
        pidns = parts[4] if len(parts) > 4 else ""
        return cls(parts[0], pid, boot, pidns)


def worker_identity() -> str:
    """A new lease owner string for this process (unique per call)."""
    return ":".join(
        (socket.gethostname(), str(os.getpid()), uuid.uuid4().hex[:8], _boot_id(), _pid_namespace())
    )


def holder_is_dead(owner: str) -> bool:
    """True only when `owner` is provably a process of this boot and PID namespace that no
    longer exists. Anything less certain (another host, container or namespace, an owner
    string without that evidence, no /proc) is False: wait for the lease to expire."""
    holder = Holder.parse(owner)
    boot, pidns = _boot_id(), _pid_namespace()
    if not (boot and pidns and holder.boot == boot and holder.pidns == pidns):
        return False
    if holder.pid is None or holder.pid == os.getpid():
        return False
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it exists, under another user
        return False
    return False
