"""A project with a meter provider (in its settings, as the telemetry how-to shows) runs
`manage.py` commands without a database: nothing queries it at exit (issue 37: every
command's exit collected the approval gauges, and `collectstatic` in a build without a
database printed two tracebacks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_command_exits_without_reading_the_database(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "AGENTRUN_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="example_project.settings",
        DJANGO_SECRET_KEY="telemetry-" + "x" * 50,
        # A meter provider (the SDK's, writing to files) and a database nobody listens on.
        AGENTRUN_TELEMETRY_DIR=str(tmp_path),
        AGENTRUN_TELEMETRY_INTERVAL="60",
        DATABASE_URL="postgres://nobody@127.0.0.1:9/none",
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "diffsettings"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "Could not count the approvals waiting" not in done.stderr
    # The meter provider did export at its shutdown (the gauges, with nothing to report).
    assert list(tmp_path.glob("metrics-*.jsonl"))
