"""The README's quick start runs as written, offline, in well under a minute.

In a temporary directory, with this test session's Python and its installed packages (the
quick start's `pip install` line is what put them there): the README's `<!-- quickstart:
shell -->` lines in bash, its `<!-- quickstart: PATH -->` blocks written to their files,
then its `<!-- quickstart: test -->` command, which must pass. No database of the test
session's (the project's test runs on its own SQLite), no broker, no network.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # `python`, `django-admin` of this virtualenv
SNIPPET = re.compile(
    r"^<!-- quickstart: (?P<target>\S+) -->\n```\w*\n(?P<body>.*?)\n```", re.S | re.M
)
# Settings of the test session that must not reach the new project's processes.
SCRUBBED_PREFIXES = ("DJANGO_", "DATABASE_URL", "AGENTRUN_", "CELERY_", "ANTHROPIC_", "PYTEST_")

pytestmark = pytest.mark.timeout(60)


def quickstart() -> dict[str, str]:
    readme = (ROOT / "README.md").read_text()
    return {m["target"]: textwrap.dedent(m["body"]) + "\n" for m in SNIPPET.finditer(readme)}


def test_quickstart__the_readme_marks_its_steps():
    steps = quickstart()
    assert list(steps) == ["shell", "myapp/agents.py", "myapp/tests.py", "test"]
    # The quick start is short: its marked steps and the install lines before them.
    section = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```\w*\n(.*?)```", section, re.S)
    code = [line for block in blocks for line in block.splitlines() if line.strip()]
    assert len(code) <= 36, len(code)


def test_quickstart__runs_offline_in_a_fresh_directory(tmp_path):
    steps = quickstart()
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED_PREFIXES)}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTEST_ADDOPTS"] = "-p no:cacheprovider"
    started = time.monotonic()

    def bash(script: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=50,
        )

    done = bash(steps.pop("shell"))
    assert done.returncode == 0, done.stdout + done.stderr
    command = steps.pop("test")
    for target, text in steps.items():
        (tmp_path / target).write_text(text)

    done = bash(command)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout, done.stdout
    assert time.monotonic() - started < 60
