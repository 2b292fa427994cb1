// The chat page: a conversation with the demo agent over django-agentrun's API.
//
// The transcript is drawn from the conversation's live stream
// (GET conversations/{id}/stream/, this app's events format): each durable event once,
// with its cursor (`<position>-<seq>`), and the model's deltas as it writes. The events
// received and the last cursor are kept in sessionStorage, so a reload draws them again
// and reconnects after the cursor (`?after=`): nothing missed, nothing twice. A turn being
// written when the page reloads has its deltas sent again from the start.
"use strict";

(() => {
  const config = JSON.parse(document.getElementById("agentrun-chat-config").textContent);
  const $ = (selector, root = document) => root.querySelector(selector);
  const transcript = $("#transcript");
  const status = $("#status");
  const stopButton = $("#stop");

  // Ids go into request paths: only a UUID is taken from the URL (a crafted `?c=` such as
  // `../runs/<id>/cancel/?` would otherwise turn this page's next POST into another one),
  // and every path segment is encoded.
  const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
  const asked = new URLSearchParams(location.search).get("c");
  let conversation = asked && UUID.test(asked) ? asked.toLowerCase() : null;
  if (asked && !conversation) history.replaceState(null, "", location.pathname);

  // An API path from its segments, each encoded (`/` included): no segment can climb out.
  const path = (...segments) => segments.map((s) => encodeURIComponent(String(s))).join("/") + "/";
  let cursor = null; // the last durable event's cursor
  let received = []; // the durable events received, kept for a reload
  let source = null; // the EventSource while the stream is open
  const runs = new Map(); // position -> {el, run, turns: Map, calls: Map}

  // --------------------------------------------------------------- the API

  function csrfToken() {
    const found = document.cookie.split("; ").find((c) => c.startsWith("csrftoken="));
    return found ? decodeURIComponent(found.split("=")[1]) : "";
  }

  async function api(method, target, body) {
    const response = await fetch(config.api + target, {
      method,
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const data = response.headers.get("Content-Type")?.includes("json") ? await response.json() : {};
    if (!response.ok) {
      throw new Error(`${data.code || response.status}: ${data.detail || response.statusText}`);
    }
    return data;
  }

  function showError(error) {
    const box = $("#error");
    box.textContent = error ? String(error.message || error) : "";
    box.hidden = !error;
  }

  // --------------------------------------------------------------- storage

  const storageKey = () => `agentrun-chat:${conversation}`;

  function save() {
    sessionStorage.setItem(storageKey(), JSON.stringify({ cursor, events: received }));
  }

  function restore() {
    const saved = JSON.parse(sessionStorage.getItem(storageKey()) || "null");
    if (!saved) return;
    for (const event of saved.events) durable(event, false);
    received = saved.events;
    cursor = saved.cursor;
  }

  // --------------------------------------------------------------- drawing

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function runAt(position, runId) {
    let found = runs.get(position);
    if (!found) {
      const node = el("section", "run");
      node.dataset.position = position;
      const label = el("div", "state", "");
      node.append(el("div", "user", ""), label);
      transcript.append(node);
      found = { el: node, label, run: runId, turns: new Map(), calls: new Map() };
      runs.set(position, found);
    }
    if (runId) found.run = runId;
    return found;
  }

  function turnAt(run, index) {
    let found = run.turns.get(index);
    if (!found) {
      const node = el("div", "turn");
      node.dataset.position = run.el.dataset.position;
      node.dataset.turn = index;
      run.el.insertBefore(node, run.label);
      found = { el: node, live: new Map(), committed: false };
      run.turns.set(index, found);
    }
    return found;
  }

  function textOf(input) {
    if (typeof input === "string") return input;
    if (Array.isArray(input)) return input.filter((b) => b.type === "text").map((b) => b.text).join("\n");
    return JSON.stringify(input);
  }

  function callCard(run, turn, id, name) {
    let card = run.calls.get(id);
    if (!card) {
      card = el("div", "call");
      card.dataset.toolCallId = id;
      card.append(el("span", "badge", "requested"), el("span", "name", name || "tool"), el("pre", "args", ""));
      card.dataset.state = "requested";
      run.calls.set(id, card);
    }
    if (name) $(".name", card).textContent = name;
    if (turn && card.parentNode !== turn.el) turn.el.append(card);
    return card;
  }

  function setCallState(card, state, detail) {
    card.dataset.state = state;
    $(".badge", card).textContent = state.replaceAll("_", " ");
    if (state !== "awaiting_approval") $(".decide", card)?.remove();
    if (detail !== undefined) {
      const shown = $(".result", card) || card.appendChild(el("pre", "result"));
      shown.textContent = typeof detail === "string" ? detail : JSON.stringify(detail, null, 2);
    }
  }

  function askApproval(run, card, callId, args) {
    $(".args", card).textContent = JSON.stringify(args, null, 2);
    setCallState(card, "awaiting_approval");
    if (!config.mayDecide || $(".decide", card)) return;
    const row = el("div", "decide");
    const approve = el("button", "approve", "Approve");
    const reject = el("button", "reject", "Reject");
    approve.type = reject.type = "button";
    approve.onclick = () => decide(run, callId, "approve", row);
    reject.onclick = () => decide(run, callId, "reject", row);
    row.append(approve, reject);
    card.append(row);
  }

  // Durable events: drawn, logged once under their cursor, kept for a reload.
  function durable(event, live = true) {
    const run = runAt(event.position, event.run);
    const payload = event.payload || {};
    const turn = Number.isInteger(payload.turn_index) ? turnAt(run, payload.turn_index) : null;
    switch (event.type) {
      case "run_created":
        $(".user", run.el).textContent = textOf(payload.input);
        break;
      case "model_response": {
        // The committed answer replaces what the deltas showed of it.
        turn.committed = true;
        for (const node of turn.el.querySelectorAll(".text, .thinking")) node.remove();
        turn.live.clear();
        const cards = [...turn.el.querySelectorAll(".call")];
        for (const block of payload.content || []) {
          if (block.type === "text") turn.el.append(el("p", "text committed", block.text));
          else if (block.type === "thinking") turn.el.append(el("p", "thinking", block.thinking || "(thinking)"));
          else if (block.type === "tool_use") {
            const card = callCard(run, turn, block.id, block.name);
            $(".args", card).textContent = JSON.stringify(block.input, null, 2);
            turn.el.append(card);
          }
        }
        for (const card of cards) if (!card.parentNode) turn.el.append(card);
        break;
      }
      case "turn_cancelled":
      case "turn_failed": {
        // Cut short: what the deltas showed stays (until a reload: deltas are not kept).
        turn.committed = true;
        for (const node of turn.el.querySelectorAll(".live")) node.classList.replace("live", "cut");
        turn.el.append(el("p", "note", event.type === "turn_failed" ? "(answer failed)" : "(answer interrupted)"));
        break;
      }
      case "tool_call_requested": {
        const card = callCard(run, turn, payload.tool_call_id, payload.name);
        $(".args", card).textContent = JSON.stringify(payload.arguments, null, 2);
        break;
      }
      case "approval_requested": {
        const card = callCard(run, turn, payload.tool_call_id);
        askApproval(run, card, event.call, (payload.payload || {}).arguments);
        break;
      }
      case "approval_decided":
      case "tool_call_started":
      case "tool_call_finished":
      case "tool_call_resolved":
      case "tool_call_unknown": {
        const card = callCard(run, turn, payload.tool_call_id);
        const state = payload.tool_call_state || (event.type === "tool_call_started" ? "running" : card.dataset.state);
        setCallState(card, state, "result" in payload ? payload.result : undefined);
        break;
      }
      default:
    }
    if (event.type.startsWith("run_") && payload.run_state) {
      run.label.textContent = payload.run_state.replaceAll("_", " ");
      run.el.dataset.state = payload.run_state;
      // The stream stays open while a message waits behind a parked run: say what it waits on.
      if (source && payload.run_state === "awaiting_approval") resting("awaiting_approval");
      else if (source && payload.run_state === "running") setStatus("working", "working…");
    }
    scroll();
    const item = el("li", "", event.type);
    item.dataset.cursor = `${event.position}-${event.seq}`;
    $("#events").append(item);
    if (live) {
      received.push(event);
      cursor = item.dataset.cursor;
      save();
    }
  }

  // Deltas: the words of the answer being written (never durable).
  function delta(d) {
    const run = runAt(d.position, d.run);
    const turn = turnAt(run, d.turn);
    if (turn.committed) return;
    if (d.kind === "attempt") {
      // An answer starts (again): drop what was shown of it.
      for (const node of turn.el.querySelectorAll(".text.live, .thinking.live")) node.remove();
      turn.live.clear();
      return;
    }
    if (d.kind === "block_start") {
      if (d.block === "text" || d.block === "thinking") {
        const node = el("p", `${d.block} live`, "");
        turn.el.append(node);
        turn.live.set(d.index, node);
      } else if (d.block === "tool_use" && d.id) {
        turn.live.set(d.index, callCard(run, turn, d.id, d.name));
      }
      return;
    }
    const target = turn.live.get(d.index);
    if (!target) return;
    if (d.kind === "text" || d.kind === "thinking") target.textContent += d[d.kind] || "";
    else if (d.kind === "input_json") $(".args", target).textContent += d.partial_json || "";
    scroll();
  }

  // Keep the newest words in view, unless the reader scrolled up.
  function scroll() {
    const bottom = document.documentElement.scrollHeight - window.innerHeight;
    if (bottom - window.scrollY < 400) window.scrollTo(0, bottom + 1000);
  }

  // --------------------------------------------------------------- the stream

  const WORDS = { awaiting_approval: "waiting for your approval", completed: "idle" };

  function resting(state) {
    setStatus(state, WORDS[state] || state.replaceAll("_", " "));
  }

  function setStatus(state, text) {
    status.dataset.state = state;
    status.textContent = text;
    stopButton.disabled = !["working", "awaiting_approval"].includes(state);
  }

  function follow() {
    if (!conversation || source) return;
    const query = cursor ? `?after=${encodeURIComponent(cursor)}` : "";
    source = new EventSource(`${config.api}${path("conversations", conversation, "stream")}${query}`);
    setStatus("working", "working…");
    source.addEventListener("run_event", (message) => durable(JSON.parse(message.data)));
    source.addEventListener("delta", (message) => delta(JSON.parse(message.data)));
    source.addEventListener("end", (message) => {
      close();
      resting(JSON.parse(message.data).run_state);
    });
    source.onerror = () => {
      // 204 (nothing active, nothing new) closes it; a dropped connection reconnects by
      // itself with Last-Event-ID.
      if (source && source.readyState === EventSource.CLOSED) {
        close();
        const last = [...runs.values()].pop();
        resting((last && last.el.dataset.state) || "completed");
      }
    };
  }

  function close() {
    if (source) source.close();
    source = null;
  }

  // --------------------------------------------------------------- actions

  async function send(event) {
    event.preventDefault();
    const input = $("#input");
    const said = input.value.trim();
    if (!said) return;
    showError(null);
    try {
      if (!conversation) {
        const started = await api("POST", "conversations/", { agent: config.agent });
        if (!UUID.test(String(started.id))) throw new Error("The API answered an unexpected id.");
        conversation = started.id;
        history.replaceState(null, "", `?c=${encodeURIComponent(conversation)}`);
      }
      const busy = ["working", "awaiting_approval"].includes(status.dataset.state);
      const body = { input: said };
      if (busy) body.policy = $("#policy").value;
      await api("POST", path("conversations", conversation, "messages"), body);
      input.value = "";
      follow();
    } catch (error) {
      showError(error);
    }
  }

  async function decide(run, callId, verb, row) {
    showError(null);
    for (const button of row.querySelectorAll("button")) button.disabled = true;
    try {
      const detail = await api("GET", path("runs", run.run));
      const pending = (detail.pending_decisions || []).find((p) => String(p.id) === String(callId));
      if (!pending || !pending.token) throw new Error("This call no longer waits for a decision.");
      const body = verb === "approve" ? { token: pending.token } : { token: pending.token, reason: "Rejected in the chat." };
      await api("POST", path("tool-calls", callId, verb), body);
      follow();
    } catch (error) {
      for (const button of row.querySelectorAll("button")) button.disabled = false;
      showError(error);
    }
  }

  async function stop() {
    showError(null);
    try {
      await api("POST", path("conversations", conversation, "stop"), { reason: "Stopped in the chat." });
      follow();
    } catch (error) {
      showError(error);
    }
  }

  $("#composer").addEventListener("submit", send);
  $("#input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) send(event);
  });
  stopButton.addEventListener("click", stop);
  $("#new").addEventListener("click", () => {
    close();
    history.replaceState(null, "", location.pathname);
    location.reload();
  });

  if (conversation) {
    restore();
    follow();
  }
})();
