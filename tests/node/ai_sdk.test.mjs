// The AI SDK's own client against a live django-agentrun server (uvicorn and a real
// worker, started by tests/workers/test_ai_sdk.py): its chat transport opens the run's
// stream in the UI message stream format, its reader rebuilds the assistant message; no
// code of ours on this side. The run parks for an approval (decided through the REST API,
// with the call's token), then a second stream replays the run from its start and goes on
// live to its end. The rebuilt message's text and tool parts must equal the transcript.
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { test } from "node:test";

import { DefaultChatTransport, readUIMessageStream } from "ai";

const { AGENTRUN_URL, AGENTRUN_RUN, AGENTRUN_AUTH, AGENTRUN_OUT } = process.env;
const auth = { Authorization: `Basic ${Buffer.from(AGENTRUN_AUTH ?? "").toString("base64")}` };
const api = `${AGENTRUN_URL}/api/agentrun`;

const transport = new DefaultChatTransport({
  api: `${api}/runs`,
  headers: auth,
  prepareReconnectToStreamRequest: ({ id }) => ({
    api: `${api}/runs/${id}/stream/?format=ai-sdk`,
    headers: auth,
  }),
});

async function rebuild(stream) {
  const snapshots = [];
  for await (const message of readUIMessageStream({ stream })) {
    snapshots.push(structuredClone(message));
  }
  return snapshots;
}

async function json(path, init = {}) {
  const response = await fetch(`${api}${path}`, {
    ...init,
    headers: { ...auth, "Content-Type": "application/json", ...(init.headers ?? {}) },
  });
  assert.ok(response.ok, `${path}: ${response.status} ${await response.clone().text()}`);
  return response.json();
}

// The transcript as UI message parts: each turn's text blocks and tool calls, in order.
function transcript(run) {
  const parts = [];
  for (const turn of run.turns) {
    const calls = Object.fromEntries(turn.tool_calls.map((c) => [c.tool_call_id, c]));
    for (const block of turn.content ?? []) {
      if (block.type === "text") parts.push({ type: "text", text: block.text });
      if (block.type === "tool_use") {
        const call = calls[block.id];
        parts.push({ type: `tool-${block.name}`, toolCallId: block.id, input: call.arguments, output: call.result });
      }
    }
  }
  return parts;
}

function shown(message) {
  return message.parts
    .filter((p) => p.type === "text" || p.type.startsWith("tool-"))
    .map((p) =>
      p.type === "text"
        ? { type: "text", text: p.text }
        : { type: p.type, toolCallId: p.toolCallId, input: p.input, output: p.output },
    );
}

test("the AI SDK rebuilds the run's message, an approval included", async () => {
  // 1. Live until the run parks: the answer streams in, the last call asks for approval.
  const first = await transport.reconnectToStream({ chatId: AGENTRUN_RUN });
  assert.ok(first, "the run's stream answered 204 (nothing active)");
  const parked = await rebuild(first);
  const message = parked.at(-1);
  assert.equal(message.id, AGENTRUN_RUN);
  const asked = message.parts.find((p) => p.state === "approval-requested");
  assert.ok(asked, JSON.stringify(message.parts));
  assert.equal(asked.type, "tool-delete_account");
  const streamed = parked.some((m) =>
    m.parts.some((p) => p.type === "text" && p.state === "streaming" && p.text.length > 0),
  );
  assert.ok(streamed, "no text part was ever seen streaming");

  // 2. The approval, through the API with the call's token (tool-calls/pending/ mints it).
  const pending = await json("/tool-calls/pending/");
  const call = pending.results.find((c) => String(c.id) === asked.approval.id);
  assert.ok(call, `approval ${asked.approval.id} is not pending`);
  await json(`/tool-calls/${call.id}/approve/`, {
    method: "POST",
    body: JSON.stringify({ token: call.token, note: "ok from node" }),
  });

  // 3. The run again from its start, live to its end.
  const second = await transport.reconnectToStream({ chatId: AGENTRUN_RUN });
  assert.ok(second, "no stream after the approval");
  const finished = (await rebuild(second)).at(-1);
  const run = await json(`/runs/${AGENTRUN_RUN}/`);
  assert.equal(run.state, "completed");
  assert.deepEqual(shown(finished), transcript(run));
  const approved = finished.parts.find((p) => p.toolCallId === asked.toolCallId);
  assert.equal(approved.state, "output-available");
  assert.equal(approved.approval.id, asked.approval.id);
  if (AGENTRUN_OUT) writeFileSync(AGENTRUN_OUT, JSON.stringify({ parked: message, finished }));
});
