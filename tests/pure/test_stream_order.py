"""A live stream sends a commit's events before the deltas of the answer that follows it,
whatever order the database read and Redis bring them in (the AI SDK's reader rejects a
part that a step boundary closed under it: tests/workers/test_ai_sdk.py)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from django_agentrun.api.stream_reads import Snapshot
from django_agentrun.api.streams import Following
from django_agentrun.api.ui_messages import UIMessageFormat

RUN = "7bdecbbf-bfee-4ee2-bba3-7131ed9d200d"


def following(answered: dict[int, int], cursor=(0, 2)) -> Following:
    first = Snapshot(state="running", resting=False, last=cursor, answered=answered)
    source = SimpleNamespace(cursor_text=lambda at: f"{at[0]}-{at[1]}", key="k")
    lease = SimpleNamespace()
    return Following(UIMessageFormat(RUN), source, cursor, first, None, lease)


def deltas_of(turn: int) -> list[tuple[str, dict]]:
    return [
        (f"1-{turn}0", {"kind": "attempt", "turn": turn, "attempt": 0, "attempt_id": "a"}),
        (f"1-{turn}1", {"kind": "block_start", "turn": turn, "index": 0, "block": "text"}),
        (f"1-{turn}2", {"kind": "text", "turn": turn, "index": 0, "text": "Bob asked"}),
    ]


def chunks(frames: list[str]) -> list[dict]:
    return [json.loads(f[len("data: ") :]) for f in frames if f.startswith("data: {")]


def test_deltas_of_a_turn_after_an_answer_not_yet_sent__wait_for_the_read():
    """Caught up from Redis after the first read: turn 1 streams while turn 0's answer,
    committed since that read, is not sent yet."""

    async def go():
        follow = following({})  # the read saw no answer: turn 0's is not sent yet
        assert list(follow.live(deltas_of(1))) == []
        assert follow.need_db and [e for e, _ in follow.held] == ["1-10", "1-11", "1-12"]
        # The read brings turn 0's answer; then the held deltas go out.
        answer = {"seq": 5, "type": "model_response", "payload": {"turn_index": 0}}
        answer["payload"]["content"] = [{"type": "text", "text": "Let me look."}]
        done = {"seq": 8, "type": "turn_completed", "payload": {"turn_index": 0}}
        read = Snapshot(
            state="running",
            resting=False,
            last=(0, 8),
            events=[answer, done],
            cursors=[(0, 5), (0, 8)],
        )
        sent = chunks(list(follow.events(read)) + list(follow.live(follow.held)))
        types = [c["type"] for c in sent if not c["type"].startswith("data-")]
        assert types.index("finish-step") < types.index("text-delta", types.index("finish-step"))
        assert types[-3:] == ["start-step", "text-start", "text-delta"]
        assert not follow.held

    asyncio.run(go())


def test_deltas_after_a_commit_nudge__wait_for_the_read():
    """In one batch from Redis: a commit's nudge past the cursor, then the next answer's
    deltas: the deltas wait for the read of that commit."""

    async def go():
        follow = following({0: 0}, cursor=(0, 5))
        batch = [("1-1", {"kind": "commit", "seq": 9}), *deltas_of(1)]
        assert list(follow.live(batch)) == []
        assert follow.need_db and len(follow.held) == 3
        read = Snapshot(state="running", resting=False, last=(0, 9), cursors=[], events=[])
        read.events = [{"seq": 9, "type": "run_continued", "payload": {}}]
        read.cursors = [(0, 9)]
        list(follow.events(read))
        assert [c["type"] for c in chunks(list(follow.live(follow.held)))] == [
            "start-step",
            "text-start",
            "text-delta",
        ]

    asyncio.run(go())


def test_a_history_that_starts_past_turn_0__its_deltas_are_held_once_only():
    """A run whose events name no earlier answer (its history came with it) still streams
    its first turn's deltas, after one read."""

    async def go():
        follow = following({})
        assert list(follow.live(deltas_of(3))) == []
        empty = Snapshot(state="running", resting=False, last=(0, 2))
        list(follow.events(empty))
        assert [c["type"] for c in chunks(list(follow.live(follow.held)))] == [
            "start-step",
            "text-start",
            "text-delta",
        ]

    asyncio.run(go())
