"""The SQL of each write shape of a turn, as the engine sends it on Postgres, rendered into
tests/postgres/golden/*.sql: any change to the statements shows in review.

    AGENTRUN_UPDATE_GOLDEN=1 pytest tests/postgres/test_golden_sql.py   # rewrite them

Statements are captured as sent, with their %s placeholders (the parts they are composed
of are named in django_agentrun/store/queries.sql)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.db import connection

from django_agentrun import start_run
from django_agentrun.engine import Outcome, advance
from django_agentrun.testing import ScriptedClient, reply, text, tool_use

pytestmark = [pytest.mark.django_db(transaction=True)]

GOLDEN = Path(__file__).with_name("golden")


@pytest.fixture(autouse=True)
def _postgres_only(monkeypatch, tmp_path):
    options = connection.settings_dict.get("OPTIONS", {})
    if connection.vendor != "postgresql" or options.get("server_side_binding"):
        pytest.skip("the composed statements are Postgres's (client-side binding)")
    monkeypatch.setenv("AGENTRUN_TEST_LOG", str(tmp_path / "log.jsonl"))


class Statements:
    """Every statement sent, as text with its %s placeholders."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def __call__(self, execute, sql, params, many, context):
        self.sent.append(sql)
        return execute(sql, params, many, context)


def _writes(run, client, outcome: str) -> list[str]:
    """The run writes (data-modifying CTEs) of one advance."""
    capture = Statements()
    with connection.execute_wrapper(capture):
        assert advance(run.pk, client=client) == outcome
    return [s for s in capture.sent if s.lstrip().startswith("WITH")]


def _check(name: str, statement: str) -> None:
    path = GOLDEN / f"{name}.sql"
    rendered = statement.strip() + "\n"
    if os.environ.get("AGENTRUN_UPDATE_GOLDEN"):
        path.write_text(rendered)
    assert path.exists(), f"no golden file {path.name}: run with AGENTRUN_UPDATE_GOLDEN=1"
    assert rendered == path.read_text(), f"{path.name} changed: review it, then update it"


def test_golden__every_write_shape_of_a_turn():
    client = ScriptedClient(
        [
            reply(tool_use("lookup", {"query": "a"}), tool_use("lookup", {"query": "b"})),
            reply(tool_use("lookup", {"query": "c"}), tool_use("delete_account", {"user": "x"})),
            reply(text("done")),
        ]
    )
    run = start_run("test-agent", "go")
    shapes = dict(
        zip(
            [
                "claim_run_started",
                "claim_turn_started",
                "response_with_intents",
                "in_flight",
                "result_and_next_in_flight",
                "result_close_turn_continue",
            ],
            _writes(run, client, Outcome.CONTINUED),
            strict=True,
        )
    )
    # Turn 1: the second call needs approval, so the first result is written alone; then
    # the run parks.
    turn1 = _writes(run, client, Outcome.PARKED)
    assert len(turn1) == 5, turn1
    assert turn1[:3] == [shapes["claim_turn_started"], *turn1[1:3]]
    shapes["result"] = turn1[3]
    shapes["park_for_approval"] = turn1[4]
    for name, statement in shapes.items():
        _check(name, statement)
    expected = {p.stem for p in GOLDEN.glob("*.sql")}
    assert set(shapes) == expected  # no golden file left behind
