// The AI SDK's own reader on a UI message stream with withdrawn parts (issue #25): chunks
// our format writes for a turn whose answer was recorded with a lost delta on the way and a
// turn cancelled mid-answer (written by tests/workers/test_ai_sdk.py into AGENTRUN_CHUNKS).
// The reader accepts them, ends every part (none left streaming), and the withdrawn ones
// carry providerMetadata.agentrun.withdrawn, which a UI filters out.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { readUIMessageStream } from "ai";

const { AGENTRUN_CHUNKS } = process.env;

test("withdrawn parts end, marked, and the record stands", { skip: !AGENTRUN_CHUNKS }, async () => {
  const chunks = JSON.parse(readFileSync(AGENTRUN_CHUNKS, "utf8"));
  const stream = new ReadableStream({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(chunk);
      controller.close();
    },
  });
  const errors = [];
  let message;
  for await (const snapshot of readUIMessageStream({ stream, onError: (e) => errors.push(e) })) {
    message = snapshot;
  }
  assert.deepEqual(errors, []);
  const texts = message.parts.filter((p) => p.type === "text");
  assert.ok(texts.every((p) => p.state === "done"), JSON.stringify(texts));
  const kept = texts.filter((p) => !p.providerMetadata?.agentrun?.withdrawn).map((p) => p.text);
  assert.deepEqual(kept, ["Hello, dear world"]);
  assert.equal(texts.length, 3);
});
