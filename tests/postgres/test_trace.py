"""The path of a model turn and of one tool call through the package's code, traced with
sys.setprofile on Postgres (the production path): the files, functions and jumps between
modules each passes. The test asserts the budget (BUDGET files each) and writes the
document that shows the trace, docs/explanation/trace.md, when run with
AGENTRUN_WRITE_TRACE=1; otherwise it fails when the committed document differs from the
trace (a change that lengthens a path says so there).

- a model turn: from the moment the engine asks the model (`model_turn.ask`) to the
  return of the `send` that commits its answer (the write-ahead intent, the first call in
  flight). The model client's own code is the model's side, as a handler is the tool's:
  the test's stand-in (django_agentrun/testing/) is left out, the SDK adapter would not be.
- a tool call: from `execution.run_call` (the call is durable in flight) to the return of
  the `send` that commits its result and what follows it.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection

from django_agentrun import start_run
from django_agentrun.engine import Outcome, advance, execution, model_turn
from django_agentrun.store.portable import PortableStore
from django_agentrun.store.postgres import PostgresStore
from django_agentrun.testing import ScriptedClient, reply, text, tool_use

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.one_driver]

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_agentrun"
STAND_IN = PACKAGE / "testing"
DOCUMENT = ROOT / "docs" / "explanation" / "trace.md"
WRITE = "AGENTRUN_WRITE_TRACE"

# Issue #27's target: 12 files each. What the engine owns is in engine/ and transitions; the
# rest of each path is the model's answer (clients/base), the events' payloads, the model
# rows' django-fsm transitions (models/base), the store's write and its JSON rule (fields).
TARGET = 12
# The tool call's path has telemetry.py (issue #28: the execute_tool span is opened at the
# one place a handler is invoked; the model turn's telemetry is recorded after its send).
# Issue #35 split what a step knows (engine/step.py) from the table of what follows it
# (engine/follows.py, with its typed facts): one module had grown past 600 lines holding
# both, and every path passes both; a file more, no more functions or jumps.
BUDGET = {"model turn": 13, "tool call": 13}

# The end of each path: the return of the store's send (the engine sends through the store
# its step chose at its start, `Step.store`).
SENDS = (PostgresStore.send.__code__, PortableStore.send.__code__)

# Comprehensions are frames of their own before Python 3.12 and inlined from 3.12 (PEP
# 709): left out, so the document is the same on every supported Python.
COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>")


class Trace:
    """Calls of the package's Python functions from `start`'s call to the return of the
    send that commits what it produced."""

    def __init__(self, start) -> None:
        self.start = start.__code__
        self.active = False
        self.done = False
        self.calls: list[tuple[str, str]] = []
        self.jumps: Counter[tuple[str, str]] = Counter()

    def __call__(self, frame, event, arg):
        code = frame.f_code
        if event == "call" and not self.active and not self.done and code is self.start:
            self.active = True
        if not self.active:
            return
        if event == "return" and code in SENDS:
            self.active, self.done = False, True
            return
        if event != "call" or not _ours(code.co_filename):
            return
        if code.co_name in COMPREHENSIONS:
            return
        here = _name(code.co_filename)
        # A function nested in a comprehension is named through it before 3.12 only
        # ("f.<locals>.<listcomp>.<genexpr>"): named as from 3.12.
        qualname = code.co_qualname
        for comprehension in COMPREHENSIONS:
            qualname = qualname.replace(f".{comprehension}", "")
        self.calls.append((here, qualname))
        caller = frame.f_back
        while caller is not None and not _ours(caller.f_code.co_filename):
            caller = caller.f_back  # through Django, psycopg, the handler
        if caller is not None and caller.f_code.co_filename != code.co_filename:
            self.jumps[_name(caller.f_code.co_filename), here] += 1

    @property
    def files(self) -> list[str]:
        return sorted({f for f, _ in self.calls})

    @property
    def functions(self) -> list[tuple[str, str]]:
        return sorted(set(self.calls))


def _ours(filename: str) -> bool:
    return filename.startswith(str(PACKAGE)) and not filename.startswith(str(STAND_IN))


def _name(filename: str) -> str:
    return Path(filename).relative_to(PACKAGE).as_posix()


def _script() -> ScriptedClient:
    return ScriptedClient([reply(tool_use("lookup", {"query": "q"})), reply(text("done"))])


def _warm() -> None:
    """One run, untraced: a worker in its steady state (its settings read, the model table
    merged, its store chosen), as every run but a process's first meets it."""
    assert advance(start_run("test-agent", "go").pk, client=_script()) == Outcome.FINISHED


def _traced(start) -> Trace:
    client = _script()
    run = start_run("test-agent", "go")
    trace = Trace(start)
    sys.setprofile(trace)
    try:
        assert advance(run.pk, client=client) == Outcome.FINISHED
    finally:
        sys.setprofile(None)
    assert trace.done, f"the trace never saw the commit after {start.__qualname__}"
    return trace


def _section(title: str, window: str, trace: Trace) -> list[str]:
    lines = [
        f"## {title}",
        "",
        window,
        "",
        f"**{len(trace.files)} files, {len(trace.functions)} functions, "
        f"{sum(trace.jumps.values())} jumps between modules** (budget: {BUDGET[title]} files; "
        f"target: {TARGET}).",
        "",
        "| file | functions |",
        "| --- | --- |",
    ]
    for name in trace.files:
        called = ", ".join(f"`{q}`" for f, q in trace.functions if f == name)
        lines.append(f"| `{name}` | {called} |")
    lines += ["", "Jumps between modules (caller's file → callee's file: how many):", ""]
    lines += ["| from | to | jumps |", "| --- | --- | --- |"]
    for (source, target), count in sorted(trace.jumps.items()):
        lines.append(f"| `{source}` | `{target}` | {count} |")
    return [*lines, ""]


def _document(turn: Trace, call: Trace) -> str:
    lines = [
        "# The hot path, traced",
        "",
        "<!-- Generated by tests/postgres/test_trace.py: run it with AGENTRUN_WRITE_TRACE=1 "
        "to write this file; without it, the test fails when this file differs from the "
        "trace. -->",
        "",
        "The test traces one run on Postgres with `sys.setprofile`, in a worker's steady state "
        "(after one run: its settings read, the model table merged; live streams off, the "
        "tests' default, which would add `streams/publisher.py`), and lists the package's own "
        "code that each path passes (paths relative to `django_agentrun/`; comprehensions are "
        "left out, as Python 3.12 inlines them). One advance of a run asks the model, records "
        "the answer with its tool call in flight (the write-ahead intent), runs the call's "
        "handler, and records its result with what follows it. What follows each step is "
        "decided in one place, `engine/follows.py`'s table `FOLLOWS`, which `follow` applies to "
        "the write; `transitions.py` makes each change (the state move, the row change, the "
        "event); the store the step chose at its start (`store/postgres.py`) sends the write "
        "as one statement.",
        "",
        *_section(
            "model turn",
            "From the moment the engine asks the model (`engine/model_turn.py` `ask`) to the "
            "return of the store's `send` that commits its answer. The model client's own code is the "
            "model's side, as a tool's handler is the tool's (the test's stand-in, "
            "`testing/`, is left out).",
            turn,
        ),
        *_section(
            "tool call",
            "From `engine/execution.py` `run_call` (the call's `in_flight` is durable) to the "
            "return of the store's `send` that commits its result and what follows it (here: the turn "
            "closed, the run going on).",
            call,
        ),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


def test_trace__a_model_turn_and_a_tool_call_take_the_paths_the_document_shows(
    postgres, test_log, capsys
):
    if connection.vendor != "postgresql":
        pytest.skip("the production path: Postgres")
    _warm()
    turn = _traced(model_turn.ask)
    call = _traced(execution.run_call)
    document = _document(turn, call)
    with capsys.disabled():
        for title, trace in (("model turn", turn), ("tool call", call)):
            print(
                f"\n[trace] {title}: {len(trace.files)} files, {len(trace.functions)} "
                f"functions, {sum(trace.jumps.values())} jumps between modules"
            )
    if os.environ.get(WRITE):
        DOCUMENT.parent.mkdir(parents=True, exist_ok=True)
        DOCUMENT.write_text(document)
    assert len(turn.files) <= BUDGET["model turn"], turn.files
    assert len(call.files) <= BUDGET["tool call"], call.files
    assert DOCUMENT.exists(), f"run with {WRITE}=1 to write {DOCUMENT.relative_to(ROOT)}"
    assert DOCUMENT.read_text() == document, (
        f"{DOCUMENT.relative_to(ROOT)} differs from the trace: run with {WRITE}=1 to write it"
    )
