"""PgBouncer for the tests: Debian's `pgbouncer`, started as a child process with a config
of its own in a temporary directory (127.0.0.1, a free port, `* = host=... port=...` so
that every database of the Postgres server, pytest's test databases included, is reached
through it; trust authentication; root starts it as the postgres user).

    python -m tests.pgbouncer [--mode transaction] [--pool-size 2] -- <command>

runs <command> (the `test-pgbouncer` stage: pytest) with a PgBouncer in front of
DATABASE_URL's server and AGENTRUN_TEST_POOLER_PORT / AGENTRUN_TEST_POOLER_MODE in its
environment: tests/settings.py then sends every connection of the test process and of the
workers it starts through it (tests/conftest.py creates and drops the test database on
the direct port). Without pgbouncer (and no way to install it: `make pgbouncer`) it says
that the tier was skipped and exits 0. Started and stopped through the shipped process
manager (django_agentrun.testing.processes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from django_agentrun.testing.processes import Process, Processes, free_port

SKIPPED = "PgBouncer is missing (apt-get install pgbouncer): the PgBouncer tier was skipped"


def executable() -> str | None:
    """The pgbouncer binary (AGENTRUN_PGBOUNCER, PATH, or Debian's /usr/sbin), or None."""
    for candidate in (os.environ.get("AGENTRUN_PGBOUNCER"), shutil.which("pgbouncer")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    debian = "/usr/sbin/pgbouncer"
    return debian if os.access(debian, os.X_OK) else None


class PgBouncer:
    """One PgBouncer in front of `host:port`, pooling `mode` with `pool_size` server
    connections per database and user. `start()`, then `port`; `stop()` ends it (and so
    closes its server connections: a test database can be dropped after that)."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 5432,
        user: str = "postgres",
        mode: str = "transaction",
        pool_size: int = 2,
    ) -> None:
        self.upstream = (host, port)
        self.user = user
        self.mode = mode
        self.pool_size = pool_size
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="agentrun-pgbouncer-"))
        self.procs = Processes(self.dir, cwd=self.dir)
        self.proc: Process | None = None

    @property
    def log(self) -> Path:
        return self.dir / "pgbouncer.log"

    def _config(self) -> str:
        host, port = self.upstream
        return "\n".join(
            [
                "[databases]",
                f"* = host={host} port={port}",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {self.port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"auth_file = {self.dir / 'userlist.txt'}",
                f"pool_mode = {self.mode}",
                f"default_pool_size = {self.pool_size}",
                "min_pool_size = 0",
                "reserve_pool_size = 0",
                "max_client_conn = 500",
                "server_reset_query = DISCARD ALL",
                "ignore_startup_parameters = extra_float_digits",
                f"logfile = {self.log}",
                f"pidfile = {self.dir / 'pgbouncer.pid'}",
                f"admin_users = {self.user}",
                "",
            ]
        )

    def start(self) -> PgBouncer:
        binary = executable()
        if binary is None:
            raise RuntimeError(SKIPPED)
        (self.dir / "userlist.txt").write_text(f'"{self.user}" ""\n')
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(self._config())
        command = [binary, str(ini)]
        if os.geteuid() == 0:  # pgbouncer refuses to run as root
            import pwd

            owner = pwd.getpwnam("postgres")
            for path in (self.dir, *self.dir.iterdir()):
                os.chown(path, owner.pw_uid, owner.pw_gid)
            command = [binary, "-u", "postgres", str(ini)]
        self.proc = self.procs.start(command, name="pgbouncer-output")
        try:
            self.proc.wait_ready(self._answers, timeout=15)
        except RuntimeError:
            log = self.log.read_text() if self.log.exists() else ""
            self.stop()
            raise RuntimeError(f"pgbouncer did not start: {log[-2000:]}") from None
        return self

    def _answers(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.alive():
            self.proc.signal(signal.SIGINT)  # immediate shutdown: server connections close
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.procs.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def env(self) -> dict[str, str]:
        """What tests/settings.py reads to connect through this PgBouncer."""
        return {"AGENTRUN_TEST_POOLER_PORT": str(self.port), "AGENTRUN_TEST_POOLER_MODE": self.mode}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a command behind a PgBouncer of its own.")
    parser.add_argument("--mode", default="transaction", choices=["transaction", "session"])
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if executable() is None:
        print(SKIPPED, flush=True)
        return 0
    url = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/agentrun"))
    bouncer = PgBouncer(
        host=url.hostname or "127.0.0.1",
        port=url.port or 5432,
        user=url.username or "postgres",
        mode=args.mode,
        pool_size=args.pool_size,
    ).start()
    print(
        f"PgBouncer ({args.mode} mode, {args.pool_size} server connections per database) "
        f"on 127.0.0.1:{bouncer.port} in front of {bouncer.upstream[0]}:{bouncer.upstream[1]}",
        flush=True,
    )
    try:
        return subprocess.call(command, env={**os.environ, **bouncer.env()})
    finally:
        bouncer.stop()


if __name__ == "__main__":
    sys.exit(main())
