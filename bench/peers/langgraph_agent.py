"""The workload on LangGraph: a `StateGraph` whose state is the list of messages (plain
dicts), a "model" node and a "tools" node, compiled with the sync `PostgresSaver`
checkpointer (`PostgresSaver.from_conn_string(url)` + `.setup()`, one connection), one
thread per run.

From "model" a conditional edge sends each `tool_use` block of the answer to "tools" as a
task of its own (`Send`, as LangGraph's prebuilt ReAct agent does by default), so each
tool call's result is saved (`put_writes`) as it ends, like a DBOS step; "tools" leads
back to "model". An answer without tool calls goes back to "model" on `pause_turn` and
ends the run on `end_turn`. The messages reducer appends, and merges the results of one
turn's tool calls into one user message (in call order), the Messages API's shape.

Durability: LangGraph's default unless the harness asks for another mode. The default is
`"async"`: each super-step's checkpoint (and each task's writes) is saved by a background
thread while the next step runs, so the loop does not wait for Postgres and the writes
can fall behind it; `invoke` returns once every write is done. `"sync"` waits for each
super-step's checkpoint before the next step starts (the side-by-side runs both).
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from bench.peers import workload

PACKAGES = ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-postgres")
_recorder: workload.Recorder | None = None
_graph: Any = None
_stack = ExitStack()


def _is_results(message: dict[str, Any]) -> bool:
    content = message["content"]
    return (
        message["role"] == "user"
        and isinstance(content, list)
        and bool(content)
        and content[0].get("type") == "tool_result"
    )


def add_messages(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = list(left)
    for message in right:
        if out and _is_results(message) and _is_results(out[-1]):
            out[-1] = {"role": "user", "content": [*out[-1]["content"], *message["content"]]}
        else:
            out.append(message)
    return out


class State(TypedDict):
    messages: Annotated[list[dict[str, Any]], add_messages]


def model_node(state: State) -> dict[str, Any]:
    content, stop = _recorder.model(state["messages"])
    return {"messages": [{"role": "assistant", "content": content, "stop_reason": stop}]}


def route(state: State) -> Any:
    last = state["messages"][-1]
    calls = workload.tool_uses(last["content"])
    if calls:
        return [Send("tools", call) for call in calls]
    return "model" if last["stop_reason"] == "pause_turn" else END


def tools_node(call: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [workload.tool_result_block(call)]}]}


def setup(url: str, recorder: workload.Recorder) -> None:
    global _recorder, _graph
    _recorder = recorder
    saver = _stack.enter_context(PostgresSaver.from_conn_string(url))
    saver.setup()
    builder = StateGraph(State)
    builder.add_node("model", model_node)
    builder.add_node("tools", tools_node)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tools", "model", END])
    builder.add_edge("tools", "model")
    _graph = builder.compile(checkpointer=saver)


def run(text: str, run_id: str, durability: str | None = None) -> None:
    config = {"configurable": {"thread_id": run_id}, "recursion_limit": 100_000}
    state = _graph.invoke(
        {"messages": [{"role": "user", "content": text}]}, config, durability=durability
    )
    if state["messages"][-1].get("stop_reason") != "end_turn":
        raise RuntimeError(f"run {run_id} did not end: {state['messages'][-1]}")


def shutdown() -> None:
    _stack.close()
