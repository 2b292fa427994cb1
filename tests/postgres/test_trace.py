"""The path of one tool call through the code is what docs/layout.md says it is: traced
with sys.setprofile from the moment the engine runs the call to the commit of its result
(on Postgres, the production path), it passes through no more files, functions and jumps
between modules than the document states. A change that lengthens the path must say so
there."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from django.db import connection

from django_agentrun import start_run
from django_agentrun.engine import Outcome, advance, execution
from django_agentrun.store import backend
from django_agentrun.testing import ScriptedClient, reply, text, tool_use

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_driver]

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_agentrun"
LAYOUT = ROOT / "docs" / "explanation" / "layout.md"
STATED = re.compile(
    r"(?P<files>\d+)\s+files,\s+(?P<functions>\d+)\s+functions\s+and\s+(?P<jumps>\d+)\s+"
    r"jumps\s+between\s+modules"
)


class Trace:
    """Calls of the package's Python functions between run_call's start and the return of
    the send that commits its result."""

    def __init__(self) -> None:
        self.active = False
        self.done = False
        self.calls: list[tuple[str, str]] = []
        self.jumps = 0

    def __call__(self, frame, event, arg):
        code = frame.f_code
        if event == "call" and not self.active and not self.done:
            if code is execution.run_call.__code__:
                self.active = True
        if not self.active:
            return
        if event == "return" and code is backend.send.__code__:
            self.active, self.done = False, True
            return
        if event != "call" or not code.co_filename.startswith(str(PACKAGE)):
            return
        here = Path(code.co_filename).relative_to(ROOT).as_posix()
        self.calls.append((here, code.co_qualname))
        caller = frame.f_back
        while caller is not None and not caller.f_code.co_filename.startswith(str(PACKAGE)):
            caller = caller.f_back  # through Django, psycopg, the handler
        if caller is not None and caller.f_code.co_filename != code.co_filename:
            self.jumps += 1


def test_trace__one_tool_call_takes_the_path_the_layout_states(postgres, test_log, capsys):
    if connection.vendor != "postgresql":
        pytest.skip("the production path: Postgres")
    client = ScriptedClient([reply(tool_use("lookup", {"query": "q"})), reply(text("done"))])
    run = start_run("test-agent", "go")
    trace = Trace()
    sys.setprofile(trace)
    try:
        assert advance(run.pk, client=client) == Outcome.FINISHED
    finally:
        sys.setprofile(None)
    assert trace.done, "the trace never saw the tool call's commit"
    files = sorted({f for f, _ in trace.calls})
    functions = sorted(set(trace.calls))
    with capsys.disabled():
        print(
            f"\n[trace] one tool call: {len(files)} files, {len(functions)} functions, "
            f"{trace.jumps} jumps between modules"
        )
        for name in files:
            print(f"[trace]   {name}: " + ", ".join(q for f, q in functions if f == name))
    stated = STATED.search(LAYOUT.read_text())
    assert stated, f"{LAYOUT.name} states no trace figures"
    assert len(files) <= int(stated["files"]), files
    assert len(functions) <= int(stated["functions"]), functions
    assert trace.jumps <= int(stated["jumps"])
