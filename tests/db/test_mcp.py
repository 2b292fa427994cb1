"""Tools from a real MCP server (tests/testapp/mcp_server.py over stdio, started by this
process through the mcp SDK), driven in this process with the scripted model client:
snapshots, classes from annotations, results, approvals, a changed server."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from django_agentrun import approve_tool_call, send_message, start_conversation, start_run
from django_agentrun.engine import Outcome
from django_agentrun.exceptions import ConfigurationError
from django_agentrun.mcp import MCPServer, classify, connections
from django_agentrun.states import SideEffect
from django_agentrun.testing import ScriptedClient, reply, text, tool_use
from tests.conftest import drive_last
from tests.processes import wait_for
from tests.testapp.mcp_server import calls

pytest.importorskip("mcp")
pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def mcp_log(tmp_path, monkeypatch):
    """A fresh server per test (this process's stdio servers are closed around it), logging
    to the test's own file."""
    path = tmp_path / "mcp.jsonl"
    monkeypatch.setenv("AGENTRUN_TEST_MCP_LOG", str(path))
    connections.close_all()
    yield path
    connections.close_all()


def test_snapshot__classes_from_a_trusted_servers_annotations():
    run = start_run("mcp-shop", "Hi")
    effects = run.config["side_effects"]
    assert effects["stock"] == "read_only"
    assert effects["set_flag"] == "idempotent_write"
    assert effects["refund"] == "non_idempotent"
    assert run.config["mcp_tools"]["refund"]["requires_approval"] is True
    assert run.config["mcp_tools"]["set_flag"]["requires_approval"] is False
    names = [t["name"] for t in run.config["tools"]]
    assert {"stock", "set_flag", "refund", "wait", "chart", "broken"} <= set(names)
    # A tool that may need a person keeps the prompt cache for an hour.
    assert run.config["cache_ttl"] == "1h"


def test_snapshot__untrusted_server__filtered_renamed_non_idempotent_asked_first():
    run = start_run("mcp-untrusted", "Hi")
    assert set(run.config["mcp_tools"]) == {"shop_stock", "refund", "chart", "broken"}
    effects = run.config["side_effects"]
    assert {effects[n] for n in ("refund", "chart", "broken")} == {"non_idempotent"}
    assert run.config["mcp_tools"]["shop_stock"]["remote"] == "stock"
    # The spec's worst case: each tool waits for a person, but for the one the host vouches
    # for (tools={"shop_stock": ...}: read_only, nobody asked).
    approval = {n: r["requires_approval"] for n, r in run.config["mcp_tools"].items()}
    assert approval == {"shop_stock": False, "refund": True, "chart": True, "broken": True}
    assert effects["shop_stock"] == "read_only"


# The MCP matrix's classes (docs/how-to/mcp.md, "Classes and approval"): only a trusted
# server's annotations count; otherwise MCP's defaults, the worst case.
ANNOTATED = {
    "stock": ("read_only", False),
    "set_flag": ("idempotent_write", False),
    "refund": ("non_idempotent", True),
}
WORST = dict.fromkeys(ANNOTATED, ("non_idempotent", True))


@pytest.mark.parametrize("protocol", ["legacy", "modern"])
@pytest.mark.parametrize(
    ("agent", "annotated", "expected"),
    [
        ("mcp-shop", "1", ANNOTATED),
        ("mcp-shop", "0", WORST),
        ("mcp-stranger", "1", WORST),
        ("mcp-stranger", "0", WORST),
    ],
    ids=["trusted-annotated", "trusted-bare", "untrusted-annotated", "untrusted-bare"],
)
def test_matrix__class_and_approval(protocol, agent, annotated, expected, monkeypatch):
    """A server speaking only the 2026-07-28 protocol (no initialize, no ping) or only the
    earlier handshake, trusted or not, its tools annotated or not."""
    monkeypatch.setenv("AGENTRUN_TEST_MCP_PROTOCOL", protocol)
    monkeypatch.setenv("AGENTRUN_TEST_MCP_ANNOTATIONS", annotated)
    run = start_run(agent, "Hi")
    got = {
        name: (run.config["side_effects"][name], run.config["mcp_tools"][name]["requires_approval"])
        for name in expected
    }
    assert got == expected
    if agent == "mcp-shop" and annotated == "1":  # and a call goes through, in that protocol
        client = ScriptedClient(
            [reply(tool_use("stock", {"item": "hat"}, id="toolu_s")), reply(text("3."))]
        )
        assert drive_last(run, client) == Outcome.FINISHED
        assert run.tool_calls.get().state == "succeeded"
        assert len(calls("stock")) == 1


def test_output_schema_mismatch__an_error_result_naming_it__not_an_unknown_outcome():
    client = ScriptedClient(
        [reply(tool_use("miscount", {"item": "hat"}, id="toolu_m")), reply(text("Hm."))]
    )
    run = start_run("mcp-crash", "Count hats")
    assert drive_last(run, client) == Outcome.FINISHED
    call = run.tool_calls.get()
    assert call.state == "errored" and call.is_error and call.result_source == "executed"
    assert "does not follow its output schema" in str(call.result)
    assert "'many' is not of type 'integer'" in str(call.result)
    assert len(calls("miscount")) == 1  # it ran, once: nobody runs it again
    sent = client.requests[1].messages[-1]["content"][0]
    assert sent["type"] == "tool_result" and sent["is_error"] is True


def test_classify__hints_count_only_when_trusted():
    assert classify({"readOnlyHint": True}, False) == (SideEffect.NON_IDEMPOTENT, True)
    assert classify({}, False) == (SideEffect.NON_IDEMPOTENT, True)
    assert classify({"readOnlyHint": True}, True) == (SideEffect.READ_ONLY, False)
    # MCP's default: a write not marked destructiveHint: false may destroy.
    assert classify({"idempotentHint": True}, True) == (SideEffect.IDEMPOTENT_WRITE, True)
    assert classify({}, True) == (SideEffect.NON_IDEMPOTENT, True)
    plain = {"idempotentHint": True, "destructiveHint": False}
    assert classify(plain, True) == (SideEffect.IDEMPOTENT_WRITE, False)
    assert classify({"destructiveHint": False}, True) == (SideEffect.NON_IDEMPOTENT, False)
    assert classify({"destructiveHint": True}, True) == (SideEffect.NON_IDEMPOTENT, True)
    assert classify({"destructiveHint": True}, True, False) == (SideEffect.NON_IDEMPOTENT, False)
    with pytest.raises(ConfigurationError):
        MCPServer.stdio("shop", "x", tools={"refund": {"side_effect": "atomic"}})
    with pytest.raises(ConfigurationError):
        MCPServer.stdio("shop", "x", tools={"refund": {"colour": "red"}})


def test_run__calls_go_to_the_server_with_their_key__results_mapped():
    client = ScriptedClient(
        [
            reply(
                tool_use("stock", {"item": "hat"}, id="toolu_stock"),
                tool_use("refund", {"order": "o1", "amount_cents": 5}, id="toolu_refund"),
                tool_use("chart", {}, id="toolu_chart"),
                tool_use("broken", {}, id="toolu_broken"),
                tool_use("stock", {"item": 7}, id="toolu_bad"),
            ),
            reply(text("Done.")),
        ]
    )
    run = start_run("mcp-crash", "Refund o1")
    assert drive_last(run, client) == Outcome.FINISHED
    got = {c.tool_call_id: c for c in run.tool_calls.all()}
    stock = got["toolu_stock"]
    assert stock.state == "succeeded" and not stock.is_error
    assert '"count": 3' in stock.result[0]["text"] or '"count":3' in stock.result[0]["text"]
    refund = got["toolu_refund"]
    assert refund.result == [{"type": "text", "text": "refunded 5 on o1"}]
    # The idempotency key travels in the request's _meta.
    assert [r["key"] for r in calls("refund")] == [refund.idempotency_key]
    assert [r["key"] for r in calls("stock")] == [stock.idempotency_key]
    chart = got["toolu_chart"]
    assert [b["type"] for b in chart.result] == ["text", "image"]
    assert chart.result[1]["source"]["media_type"] == "image/png"
    broken = got["toolu_broken"]
    assert broken.state == "errored" and broken.is_error
    assert "the warehouse is closed" in str(broken.result)
    # Arguments are checked against the server's input schema before anything is sent.
    bad = got["toolu_bad"]
    assert bad.state == "errored" and "Invalid arguments" in str(bad.result)
    assert len(calls("stock")) == 1
    # The next request sent the results back in order, the tools as snapshotted.
    second = client.requests[1]
    assert [t["name"] for t in second.tools] == [t["name"] for t in run.config["tools"]]


def test_destructive_call__waits_for_approval__then_runs_once():
    client = ScriptedClient(
        [
            reply(tool_use("refund", {"order": "o2", "amount_cents": 9}, id="toolu_r")),
            reply(text("Refunded.")),
        ]
    )
    run = start_run("mcp-shop", "Refund o2")
    assert drive_last(run, client) == Outcome.PARKED
    assert run.state == "awaiting_approval"
    assert calls("refund") == []
    person = get_user_model().objects.create_user("pat", password="x")
    approve_tool_call(run.tool_calls.get(), by=person)
    assert drive_last(run, client) == Outcome.FINISHED
    assert len(calls("refund")) == 1


def test_changed_server__a_run_and_its_conversation_keep_their_snapshot(monkeypatch):
    conversation = start_conversation("mcp-crash")
    run = send_message(conversation, "How many hats?")
    before = [dict(t) for t in run.config["tools"]]
    assert "discount" not in {t["name"] for t in before}
    # The server changes (a new description, a new tool) and is restarted.
    monkeypatch.setenv("AGENTRUN_TEST_MCP_VERSION", "2")
    connections.close_all()
    client = ScriptedClient(
        [reply(tool_use("stock", {"item": "hat"}, id="toolu_s")), reply(text("3 hats."))]
    )
    assert drive_last(run, client) == Outcome.FINISHED
    assert all(r.tools == before for r in client.requests)
    # The conversation's next run keeps the conversation's snapshot too.
    follow_up = send_message(conversation, "And now?")
    assert follow_up.config["tools"] == before
    # A new run lists the server as it is now.
    fresh = start_run("mcp-crash", "Hi")
    tools = {t["name"]: t for t in fresh.config["tools"]}
    assert "discount" in tools and tools["stock"]["description"].endswith("(v2)")


def test_progress__heartbeats_the_call__ticks_on_the_runs_live_stream(stream_redis):
    import json

    import redis

    from django_agentrun import streams

    client = ScriptedClient(
        [reply(tool_use("wait", {"seconds": 0.6}, id="toolu_w")), reply(text("Waited."))]
    )
    run = start_run("mcp-crash", "Wait")
    assert drive_last(run, client) == Outcome.FINISHED
    assert streams.publisher().flush()
    stored = redis.Redis.from_url(stream_redis).xrange(streams.run_key(run.pk))
    items = [json.loads(fields[b"d"]) for _, fields in stored]
    ticks = [i for i in items if i["kind"] == "tool_progress"]
    assert len(ticks) >= 2, items
    assert {(t["tool_call_id"], t["tool"]) for t in ticks} == {("toolu_w", "wait")}
    assert ticks[0]["message"] == "waiting" and ticks[0]["total"] >= 2
    assert run.tool_calls.get().heartbeat_at is not None


def test_timeout__a_read_only_call_is_told_it_timed_out__the_server_is_cancelled():
    client = ScriptedClient(
        [reply(tool_use("wait", {"seconds": 5}, id="toolu_w")), reply(text("Too slow."))]
    )
    run = start_run("mcp-impatient", "Wait")
    assert drive_last(run, client) == Outcome.FINISHED
    call = run.tool_calls.get()
    assert call.state == "errored" and "did not answer within 0.5 s" in str(call.result)
    cancelled = wait_for(lambda: calls("cancelled"), timeout=5, message="the server's cancel")
    assert cancelled[0]["key"] == call.idempotency_key


def test_api__a_server_that_cannot_be_reached__503_nothing_started(monkeypatch):
    from rest_framework.test import APIClient

    from django_agentrun.models import Run
    from tests.processes import free_port

    monkeypatch.setenv("AGENTRUN_TEST_MCP_URL", f"http://127.0.0.1:{free_port()}/mcp")
    client = APIClient()
    client.force_authenticate(get_user_model().objects.create_user("ann", password="x"))
    response = client.post(
        "/api/agentrun/runs/", {"agent": "mcp-http", "input": "Hi"}, format="json"
    )
    assert response.status_code == 503, response.content
    assert response.json()["code"] == "mcp_unavailable"
    assert not Run.objects.exists()
