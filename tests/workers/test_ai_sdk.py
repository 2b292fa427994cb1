"""The AI SDK format read by the AI SDK itself: `node --test tests/node/` (the `ai` package
from npm, its chat transport and UI message stream reader) against uvicorn and a real
worker, the run parking for an approval on the way. Run by `make test-node`, which
installs the package with `npm ci` first."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from django_agentrun import start_run
from django_agentrun.testing.messages_api import Reply, by_step, text, tool_use
from tests import factories
from tests.processes import wait_resting

NODE_TESTS = Path(__file__).resolve().parents[1] / "node"


def slow(*blocks) -> Reply:
    return Reply(list(blocks), chunk_size=6, delay=0.01)


@pytest.mark.timeout(180)
def test_ai_sdk__rebuilds_the_message_with_an_approval(
    workers, messages_api, asgi_server, tmp_path
):
    node = shutil.which("node")
    if node is None or not (NODE_TESTS / "node_modules" / "ai").is_dir():
        pytest.skip("needs Node and `npm ci` in tests/node (make test-node does both)")
    alice = factories.user("alice", "approve_toolcall")
    messages_api.script = by_step(
        [
            slow(text("Let me look Bob up first."), tool_use("lookup", {"query": "bob"})),
            slow(
                text("Bob asked to leave: deleting."), tool_use("delete_account", {"user": "bob"})
            ),
            slow(text("Done: Bob's account is deleted.")),
        ]
    )
    run = start_run("test-agent", "Delete Bob's account.", owner=alice)
    out = tmp_path / "message.json"
    withdrawn = tmp_path / "withdrawn.json"
    withdrawn.write_text(json.dumps(withdrawn_chunks()))
    done = subprocess.run(
        [node, "--test", "--test-reporter=spec", str(NODE_TESTS)],
        cwd=NODE_TESTS,
        env={
            **os.environ,
            "AGENTRUN_URL": asgi_server.url,
            "AGENTRUN_RUN": str(run.pk),
            "AGENTRUN_AUTH": "alice:pw",
            "AGENTRUN_OUT": str(out),
            "AGENTRUN_CHUNKS": str(withdrawn),
        },
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "ℹ pass 2" in done.stdout and "ℹ fail 0" in done.stdout, done.stdout[-2000:]
    wait_resting(run)
    assert run.state == "completed"
    finished = json.loads(out.read_text())["finished"]
    texts = [p["text"] for p in finished["parts"] if p["type"] == "text"]
    assert texts == [
        "Let me look Bob up first.",
        "Bob asked to leave: deleting.",
        "Done: Bob's account is deleted.",
    ]
    decided = run.tool_calls.get(name="delete_account")
    assert (decided.approved, decided.decision_note) == (True, "ok from node")


def withdrawn_chunks() -> list[dict]:
    """What the ai-sdk format writes for a turn recorded after a lost delta, then a turn
    cancelled mid-answer (read by tests/node/withdrawn.test.mjs)."""
    from django_agentrun.api.ui_messages import UIMessageFormat

    fmt = UIMessageFormat("run-1")
    out = fmt.open()
    for turn, texts in ((0, ["Hello, ", "world"]), (1, ["Never recorded"])):
        out += fmt.delta({"kind": "attempt", "turn": turn, "attempt": 0, "attempt_id": "a"})
        out += fmt.delta({"kind": "block_start", "turn": turn, "index": 0, "block": "text"})
        for piece in texts:
            out += fmt.delta({"kind": "text", "turn": turn, "index": 0, "text": piece})
        if turn == 0:
            content = [{"type": "text", "text": "Hello, dear world"}]
            answer = {"turn_index": 0, "content": content}
            out += fmt.event({"seq": 3, "type": "model_response", "payload": answer}, "3")
            out += fmt.event(
                {"seq": 4, "type": "turn_completed", "payload": {"turn_index": 0}}, "4"
            )
    out += fmt.close("cancelled", "5")
    lines = "".join(out).split("\n")
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
