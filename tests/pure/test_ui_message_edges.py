"""The AI SDK format's edges (issue #25): text the reader saw that was never recorded is
withdrawn before the message ends (a cancelled turn, a lost delta, a stream that pauses),
and part ids never repeat across a reader's reconnects."""

from __future__ import annotations

import json

from django_agentrun.api.ui_messages import WITHDRAWN, UIMessageFormat


def chunks(lines: list[str]) -> list[dict]:
    out = []
    for line in "".join(lines).split("\n"):
        if line.startswith("data: ") and line != "data: [DONE]":
            chunk = json.loads(line[6:])
            if chunk["type"] != "data-agentrun-event":
                out.append(chunk)
    return out


def writing(fmt: UIMessageFormat, *texts: str, turn: int = 0) -> list[dict]:
    shown = fmt.delta({"kind": "attempt", "turn": turn, "attempt": 0, "attempt_id": "a"})
    shown += fmt.delta({"kind": "block_start", "turn": turn, "index": 0, "block": "text"})
    for piece in texts:
        shown += fmt.delta({"kind": "text", "turn": turn, "index": 0, "text": piece})
    shown += fmt.delta({"kind": "block_stop", "turn": turn, "index": 0})
    return chunks(shown)


def event(kind: str, seq: int, **payload) -> dict:
    return {"seq": seq, "type": kind, "payload": payload, "created_at": "2026-01-01T00:00:00Z"}


def test_ui_messages__a_cancelled_turns_unrecorded_text_is_withdrawn():
    fmt = UIMessageFormat("run-1")
    shown = writing(fmt, "Refunding ", "your order")
    part = shown[2]["id"]
    # Until its answer is recorded, the part stays open (streaming), even past block_stop.
    assert [c["type"] for c in shown] == ["start-step", "text-start", "text-delta", "text-delta"]
    after = chunks(fmt.event(event("turn_cancelled", 5, turn_index=0), "5"))
    after += chunks(fmt.close("cancelled", "6"))
    assert after[:2] == [
        {"type": "text-end", "id": part, "providerMetadata": WITHDRAWN},
        {"type": "data-agentrun-withdrawn", "data": {"parts": [part]}, "transient": True},
    ]
    assert [c["type"] for c in after[2:]] == ["finish-step", "finish"]


def test_ui_messages__a_run_that_rests_mid_answer_withdraws_it_at_the_end():
    """The worker died mid-answer, then the run was cancelled: no turn event came."""
    fmt = UIMessageFormat("run-1")
    part = writing(fmt, "Half an ans")[1]["id"]
    ended = chunks(fmt.close("cancelled", "4"))
    assert ended[0] == {"type": "text-end", "id": part, "providerMetadata": WITHDRAWN}
    assert ended[-1] == {"type": "finish", "finishReason": "other"}


def test_ui_messages__a_lost_delta_withdraws_the_part_and_shows_the_record():
    fmt = UIMessageFormat("run-1")
    part = writing(fmt, "Hello, ", "world")[1]["id"]  # ", dear" was lost on the way
    recorded = chunks(
        fmt.event(
            event(
                "model_response",
                3,
                turn_index=0,
                content=[{"type": "text", "text": "Hello, dear world"}],
            ),
            "3",
        )
    )
    assert recorded[0] == {"type": "text-end", "id": part, "providerMetadata": WITHDRAWN}
    fresh = [c for c in recorded if c["type"].startswith("text-") and c.get("id") != part]
    assert [c["type"] for c in fresh] == ["text-start", "text-delta", "text-end"]
    assert fresh[1]["delta"] == "Hello, dear world"


def test_ui_messages__a_recorded_answer_ends_its_part_as_done():
    fmt = UIMessageFormat("run-1")
    part = writing(fmt, "Hello")[1]["id"]
    recorded = chunks(
        fmt.event(
            event(
                "model_response", 3, turn_index=0, content=[{"type": "text", "text": "Hello there"}]
            ),
            "3",
        )
    )
    assert recorded == [
        {"type": "text-delta", "id": part, "delta": " there"},
        {"type": "text-end", "id": part},
    ]


def test_ui_messages__part_ids_are_unique_across_reconnects():
    """Two connections to the same run (a reader that reconnects keeps the message): the
    live parts and the parts of recorded answers never share an id."""
    seen = []
    for _ in range(2):
        fmt = UIMessageFormat("run-1")
        answer = event("model_response", 3, turn_index=0, content=[{"type": "text", "text": "A"}])
        seen += [c["id"] for c in chunks(fmt.event(answer, "3")) if c["type"] == "text-start"]
        seen += [c["id"] for c in writing(fmt, "B", turn=1) if c["type"] == "text-start"]
    assert len(seen) == 4 and len(set(seen)) == 4, seen


def test_ui_messages__a_retried_attempt_withdraws_what_the_first_showed():
    fmt = UIMessageFormat("run-1")
    part = writing(fmt, "First try")[1]["id"]
    retry = {"kind": "attempt", "turn": 0, "attempt": 1, "attempt_id": "b", "restart": True}
    shown = chunks(fmt.delta(retry))
    assert shown[0] == {"type": "text-end", "id": part, "providerMetadata": WITHDRAWN}
    assert [c["type"] for c in shown[1:]] == ["data-agentrun-withdrawn", "data-agentrun-restart"]
