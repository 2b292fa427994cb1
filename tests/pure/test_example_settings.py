"""The example project is safe to copy (issue #25): DEBUG off unless asked for, and no
secret but the environment's (nothing starts without one), except under the demo
commands, which make one up for their own processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SHOW = (
    "import sys; sys.argv = ['manage.py'] + sys.argv[1:]; "
    "import example_project.settings as s; print(s.DEBUG, len(s.SECRET_KEY))"
)


def settings_of(*argv: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    return subprocess.run(
        [sys.executable, "-c", SHOW, *argv],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_example_settings__refuse_to_start_without_a_secret():
    found = settings_of("runserver")
    assert found.returncode != 0
    assert "ImproperlyConfigured: Set DJANGO_SECRET_KEY in the environment" in found.stderr


def test_example_settings__debug_is_off_unless_asked_for():
    assert settings_of("runserver", DJANGO_SECRET_KEY="s" * 50).stdout.split() == ["False", "50"]
    on = settings_of("runserver", DJANGO_SECRET_KEY="s" * 50, DJANGO_DEBUG="1")
    assert on.stdout.split() == ["True", "50"]


def test_example_settings__the_demo_commands_make_up_a_secret():
    for command in ("agentrun_demo", "agentrun_chat"):
        found = settings_of(command)
        assert found.returncode == 0, found.stderr
        debug, length = found.stdout.split()
        assert debug == "False" and int(length) >= 50
