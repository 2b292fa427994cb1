"""A conversation's live stream as it is served: uvicorn (one process) and a real Celery
worker on Postgres and Redis, the real `anthropic` SDK streaming slowly from the Messages
API stand-in, over two runs: the first parks on an approval, and a follow-up queued
behind it continues on the same stream.

A client that drops its connection at random points and reconnects with `Last-Event-ID`
receives every durable event of both runs exactly once and in order, and the deltas of
each turn it watched to its answer add up to the committed text."""

from __future__ import annotations

import random

from django_agentrun import approve_tool_call, send_message, start_conversation
from django_agentrun.models import RunEvent
from django_agentrun.testing.messages_api import Reply, text, tool_use
from tests import factories
from tests.factories import by_message
from tests.processes import wait_resting
from tests.streams import read_with_drops

LONG = "Otters hold hands while they sleep, so that they do not drift apart. " * 4


def slow(*blocks) -> Reply:
    """A reply the stand-in streams slowly: 8 characters a delta, 15 ms apart."""
    return Reply(list(blocks), chunk_size=8, delay=0.015)


def test_conversation_stream__reconnects_at_random_across_runs_miss_nothing_repeat_nothing(
    workers, messages_api, asgi_server, figures
):
    alice = factories.user("alice")
    ann = factories.user("ann", "approve_toolcall")
    messages_api.script = by_message(
        {
            "Delete bob, then tell me about otters.": [
                slow(text(LONG), tool_use("delete_account", {"user": "bob"})),
                slow(text("Deleted bob. " + LONG[::-1])),
            ],
            "And sea otters?": [slow(text("Sea otters: " + LONG))],
        }
    )
    conversation = start_conversation("test-agent", owner=alice)
    first = send_message(conversation, "Delete bob, then tell me about otters.", by=alice)
    follow_ups = []

    def on_end(end) -> bool:
        # The conversation rests on the approval: approve, queue a follow-up, read on.
        if end["run_state"] != "awaiting_approval" or follow_ups:
            return False
        approve_tool_call(first.tool_calls.get(), by=ann)
        follow_ups.append(send_message(conversation, "And sea otters?", by=alice))
        return True

    path = f"/api/agentrun/conversations/{conversation.pk}/stream/"
    connections = read_with_drops(asgi_server, path, random.Random(18), on_end=on_end)
    assert follow_ups, "the stream never rested on the approval"
    second = follow_ups[0]
    wait_resting(first)
    wait_resting(second)
    assert (first.state, second.state) == ("completed", "completed")
    assert first.cancel_requested_at is None  # dropped connections cancelled nothing

    durable = [(f.id, f.json["type"]) for c in connections for f in c if f.event == "run_event"]
    stored = [
        (f"{run.conversation_position}-{seq}", kind)
        for run in (first, second)
        for seq, kind in RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "type")
    ]
    assert durable == stored  # every event of both runs, once, in order

    # Deltas: a turn's text, from its attempt marker to its answer within one connection.
    committed = {
        (run.conversation_position, t.index): "".join(
            b["text"] for b in t.content if b["type"] == "text"
        )
        for run in (first, second)
        for t in run.turns.all()
    }
    watched, replays = {}, 0
    for frames in connections:
        texts: dict[tuple[int, int], str] = {}
        for i, frame in enumerate(frames):
            data = frame.json
            if frame.event == "delta":
                turn = (data["position"], data["turn"])
                if data["kind"] == "attempt":
                    texts[turn] = ""
                    replays += i <= 1  # the current turn's deltas again, from the start
                elif data["kind"] == "text" and turn in texts:
                    texts[turn] += data["text"]
            elif frame.event == "run_event" and data["type"] == "model_response":
                turn = (data["position"], data["payload"]["turn_index"])
                if turn in texts:
                    watched[turn] = texts.pop(turn)
    assert watched, "no turn was watched from its start to its answer"
    assert all(watched[turn] == committed[turn] for turn in watched), (watched, committed)
    figures(
        f"[conversation stream] {len(connections)} connections with random drops over 2 runs: "
        f"{len(durable)} events once each; {len(watched)} of {len(committed)} turns watched "
        f"whole, {replays} mid-turn replays"
    )
