"""The command line of a real Celery worker for the example project, shared by the
integration tests and the benchmarks (standard library only, importable from both)."""

from __future__ import annotations

import sys


def celery_worker_argv(
    queue: str, name: str, *, pool: str = "solo", concurrency: int = 1
) -> list[str]:
    """A worker on one queue only, without gossip/mingle/heartbeat (fast start, no chatter)."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "example_project",
        "worker",
        f"--pool={pool}",
        f"--concurrency={concurrency}",
        "-Q",
        queue,
        "-n",
        name,
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-l",
        "info",
    ]
