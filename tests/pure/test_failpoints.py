from __future__ import annotations

import subprocess
import sys

import pytest

from django_agentrun.failpoints import POINTS, FailpointError, failpoint


def test_failpoints__free_when_unset(monkeypatch):
    monkeypatch.delenv("AGENTRUN_FAILPOINTS", raising=False)
    assert POINTS
    assert [failpoint(name) for name in POINTS] == [None] * len(POINTS)


def test_failpoints__raise_and_qualifier(monkeypatch):
    monkeypatch.setenv("AGENTRUN_FAILPOINTS", "tool.after_handler@send_message=raise")
    failpoint("tool.after_handler", "lookup")  # another tool: nothing
    failpoint("tool.after_handler")
    with pytest.raises(FailpointError):
        failpoint("tool.after_handler", "send_message")


def test_failpoints__unknown_name_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("AGENTRUN_FAILPOINTS", "tool.after_handlr=crash")
    with pytest.raises(ValueError, match="unknown failpoint 'tool.after_handlr'"):
        failpoint("tool.after_handler")


def test_failpoints__crash_ends_the_process_at_once():
    code = (
        "import os; os.environ['AGENTRUN_FAILPOINTS'] = 'model.after_commit=crash'\n"
        "from django_agentrun.failpoints import failpoint\n"
        "failpoint('model.after_commit')\n"
        "print('survived')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 137
    assert "survived" not in proc.stdout
