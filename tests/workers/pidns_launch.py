"""Start a command as a process of another PID namespace whose pid there names no process
in the parent namespace: what a worker in a container sharing the host name looks like
from the host (its `host:pid` says nothing here).

    unshare --pid --fork python -m tests.workers.pidns_launch COMMAND...

Runs as pid 1 of the new namespace (/proc stays the parent's, unmounted): forks until a
child's pid is unused in the parent namespace, execs COMMAND there, forwards SIGTERM and
SIGINT, and exits with its status. Standard library only.
"""

from __future__ import annotations

import os
import signal
import sys


def main(argv: list[str]) -> int:
    while True:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            mine = os.getpid()  # in the new namespace; /proc/<mine> is the parent's
            if os.path.exists(f"/proc/{mine}"):
                os._exit(0)
            os.write(write, str(mine).encode())
            os.close(write)
            os.execvp(argv[0], argv)
        os.close(write)
        chosen = os.read(read, 32)
        os.close(read)
        if chosen:
            break
        os.waitpid(pid, 0)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda s, _f: os.kill(pid, s))
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
