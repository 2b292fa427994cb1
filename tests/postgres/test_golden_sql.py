"""What each write shape of a turn sends on Postgres, rendered into tests/postgres/golden/
(one JSON file per shape): the statement's name in queries.sql and its parameters, with
what changes from run to run (ids, times, keys) masked. Any change to what a turn writes
shows in review.

    AGENTRUN_UPDATE_GOLDEN=1 pytest tests/postgres/test_golden_sql.py   # rewrite them

Every statement is complete in queries.sql (test_write.py checks that it names each
column it may change); these files show the values each shape gives it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from django.db import connection

from django_agentrun import start_run
from django_agentrun.engine import Outcome, advance
from django_agentrun.store.sql import QUERIES
from django_agentrun.testing import ScriptedClient, reply, text, tool_use

pytestmark = [pytest.mark.django_db(transaction=True)]

GOLDEN = Path(__file__).with_name("golden")


@pytest.fixture(autouse=True)
def _postgres_only(monkeypatch, tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("the statements of queries.sql are Postgres's")
    monkeypatch.setenv("AGENTRUN_TEST_LOG", str(tmp_path / "log.jsonl"))


class Statements:
    """Every named statement sent, with its parameters (by name)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []
        self.names = {text: name for name, text in QUERIES.items()}

    def __call__(self, execute, sql, params, many, context):
        name = self.names.get(sql)
        if name is None and ";\n" in sql:  # the claim with its history reads
            name = "+".join(self.names.get(part, "?") for part in sql.split(";\n"))
        if name is not None:
            self.sent.append((name, dict(params or {})))
        return execute(sql, params, many, context)


_MASKS = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
    (re.compile(r"\b[0-9a-f]{32}\b"), "<uuid>"),
    (re.compile(r"\b[0-9a-f]{64}\b"), "<hex64>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)?"), "<time>"),
    (re.compile(r"toolu_\w+"), "<toolu>"),
    (re.compile(r"msg_\w+"), "<msg>"),
    (re.compile(r"req_\w+"), "<req>"),
]
_VOLATILE = {"id", "turn_id", "epoch", "owner", "worker", "cost_usd"}


def _mask(value):
    if isinstance(value, str):
        if value[:1] in "[{":
            try:
                return _mask(json.loads(value))
            except ValueError:
                pass
        for pattern, replacement in _MASKS:
            value = pattern.sub(replacement, value)
        return value
    if isinstance(value, dict):
        return {k: "<masked>" if k in _VOLATILE else _mask(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v) for v in value]
    if isinstance(value, int | float | bool | type(None)):
        return value
    return _mask(str(value))  # a UUID, a Decimal


def _writes(run, client, outcome: str) -> list[tuple[str, dict]]:
    capture = Statements()
    with connection.execute_wrapper(capture):
        assert advance(run.pk, client=client) == outcome
    return capture.sent


def _check(name: str, sent: tuple[str, dict]) -> None:
    path = GOLDEN / f"{name}.json"
    statement, params = sent
    masked = {"statement": statement, "params": _mask(params)}
    rendered = json.dumps(masked, indent=2, sort_keys=True) + "\n"
    if os.environ.get("AGENTRUN_UPDATE_GOLDEN"):
        path.write_text(rendered)
    assert path.exists(), f"no golden file {path.name}: run with AGENTRUN_UPDATE_GOLDEN=1"
    assert rendered == path.read_text(), f"{path.name} changed: review it, then update it"


def test_golden__every_write_shape_of_a_turn(settings):
    settings.AGENTRUN_TOOL_CONCURRENCY = 1  # one call at a time (a batch: the test below)
    client = ScriptedClient(
        [
            reply(tool_use("lookup", {"query": "a"}), tool_use("lookup", {"query": "b"})),
            reply(tool_use("lookup", {"query": "c"}), tool_use("delete_account", {"user": "x"})),
            reply(text("done")),
        ]
    )
    run = start_run("test-agent", "go")
    sent = _writes(run, client, Outcome.PARKED)
    names = [
        "claim",  # the lease and the history, in one round trip
        "claim_run_started",  # queued -> running, in the claim's transaction
        "answer_first_call_in_flight",
        "result_next_call_in_flight",
        "result_turn_closed_run_goes_on",  # the next turn begins in this task
        "answer_first_call_in_flight_2",
        "result_park_for_approval",  # the next call needs a person: the run parks
    ]
    assert [s[0] for s in sent] == [
        "claim_released+select_turns+select_tool_calls" if "+" in sent[0][0] else "claim_released",
        *(["select_turns", "select_tool_calls"] if "+" not in sent[0][0] else []),
        *["write"] * 6,
    ]
    writes = [s for s in sent if s[0] == "write"]
    shapes = dict(zip(names[1:], writes, strict=True))
    for name, statement in shapes.items():
        _check(name, statement)
    expected = {p.stem for p in GOLDEN.glob("*.json")} - set(BATCH)
    assert set(shapes) == expected  # no golden file left behind


BATCH = [
    "batch_answer_calls_in_flight",  # the answer with both calls in flight
    "batch_results_turn_closed_run_goes_on",  # both results, the turn closed
]


def test_golden__the_write_shapes_of_a_batch():
    client = ScriptedClient(
        [
            reply(tool_use("lookup", {"query": "a"}), tool_use("lookup", {"query": "b"})),
            reply(text("done")),
        ]
    )
    run = start_run("test-agent", "go")
    sent = _writes(run, client, Outcome.FINISHED)
    writes = [s for s in sent if s[0] == "write"]
    assert len(writes) == 4  # the claim's, the batch's two, the final answer's
    for name, statement in zip(BATCH, writes[1:3], strict=True):
        _check(name, statement)
