"""The workload on DBOS: one `@DBOS.workflow` per run, the model call and each tool call a
`@DBOS.step` (each step's output is checkpointed in the system database as it ends).

DBOS is configured with only a system database (`system_database_url`: the peer's own
database; DBOS creates its `dbos` schema there on launch), no application database
(the workload has no `@DBOS.transaction`). The workflow runs in the calling thread
(a direct call), with the run's id as the workflow id.
"""

from __future__ import annotations

from typing import Any

from dbos import DBOS, DBOSConfig, SetWorkflowID

from bench.peers import workload

PACKAGES = ("dbos",)
_recorder: workload.Recorder | None = None


@DBOS.step()
def model_step(messages: list[dict[str, Any]]) -> dict[str, Any]:
    content, stop = _recorder.model(messages)
    return {"role": "assistant", "content": content, "stop_reason": stop}


@DBOS.step()
def tool_step(call: dict[str, Any]) -> dict[str, Any]:
    return workload.tool_result_block(call)


@DBOS.workflow()
def agent_run(text: str) -> str:
    messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
    while True:
        answer = model_step(messages)
        messages.append({"role": "assistant", "content": answer["content"]})
        if answer["stop_reason"] == "end_turn":
            return answer["content"][0]["text"]
        calls = workload.tool_uses(answer["content"])
        if calls:
            messages.append({"role": "user", "content": [tool_step(c) for c in calls]})


def setup(url: str, recorder: workload.Recorder) -> None:
    global _recorder
    _recorder = recorder
    config: DBOSConfig = {
        "name": "agentrun-side-by-side",
        "system_database_url": url,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()


def run(text: str, run_id: str) -> None:
    with SetWorkflowID(run_id):
        agent_run(text)


def shutdown() -> None:
    DBOS.destroy()
