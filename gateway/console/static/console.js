// The mixgate operator console: plain browser JavaScript, no build step. It reads the
// console's JSON API (/console/api/...) once a second and keeps ten minutes of history here,
// in the tab; the API key lives in this tab's sessionStorage only.
"use strict";

const KEY_STORAGE = "mixgate.console.key";
const LIVE_INTERVAL_MS = 1000;
const LISTS_INTERVAL_MS = 2000;
const HISTORY_POINTS = 600; // ten minutes at one point a second
const PAGE = 10;
const CLASSES = ["interactive", "bulk"];
const TERMINAL_JOB = new Set(["completed", "failed", "cancelled", "expired"]);

const $ = (id) => document.getElementById(id);

const consoleState = {
  session: null,
  history: { t: [], queue: { interactive: [], bulk: [] }, ttftP50: [], ttftP99: [],
             tokens: { interactive: [], bulk: [] }, kv: [] },
  charts: {},
  jobs: { cursors: [null], index: 0 },
  batches: { cursors: [null], index: 0 },
  timers: [],
  lastLive: null,
};
window.mixgateConsole = consoleState; // read by the browser tests and handy in devtools

// ---- HTTP ------------------------------------------------------------------------------

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORAGE);
  return key ? { Authorization: "Bearer " + key } : {};
}

class ApiError extends Error {
  constructor(status, body) {
    const err = (body && body.error) || {};
    super(err.message || "HTTP " + status);
    this.status = status;
    this.code = err.code || null;
  }
}

async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    headers: { ...authHeaders(), ...(options.headers || {}) },
  });
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = null; }
  if (!response.ok) {
    const error = new ApiError(response.status, body);
    if (response.status === 401 && consoleState.session) keyRejected(error);
    throw error;
  }
  return body;
}

// ---- formatting --------------------------------------------------------------------------

function ms(seconds) {
  return seconds === null || seconds === undefined ? "–" : (seconds * 1000).toFixed(1) + " ms";
}
function num(value, digits = 1) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}
function pct(value) {
  return value === null || value === undefined ? "–" : (value * 100).toFixed(1) + " %";
}
function age(unixSeconds) {
  if (!unixSeconds) return "–";
  const s = Math.max(0, Date.now() / 1000 - unixSeconds);
  if (s < 60) return s.toFixed(0) + " s";
  if (s < 3600) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
function until(unixSeconds) {
  if (!unixSeconds) return "none";
  const s = unixSeconds - Date.now() / 1000;
  return s >= 0 ? "in " + age(Date.now() / 1000 - s) : "passed";
}
function cell(text, attrs = {}) {
  const td = document.createElement("td");
  td.textContent = text;
  for (const [k, v] of Object.entries(attrs)) td.setAttribute(k, v);
  return td;
}
// A number cell: the formatted text, and the raw value in data-value (what tests compare).
function valueCell(id, value, format) {
  return cell(format(value), { id, "data-value": value === null || value === undefined ? "" : String(value) });
}

// ---- sign-in -----------------------------------------------------------------------------

function showMessage(text) {
  const box = $("auth-message");
  box.textContent = text;
  box.hidden = !text;
}

async function signIn(key) {
  if (key !== undefined) sessionStorage.setItem(KEY_STORAGE, key);
  let session;
  try {
    session = await api("/console/api/session");
  } catch (error) {
    if (error.status === 401) {
      keyRejected(error);
    } else {
      stop();
      $("main").hidden = true;
      showMessage("The console could not reach the server: " + error.message);
    }
    return;
  }
  showMessage("");
  consoleState.session = session;
  $("who").textContent = "tenant " + session.tenant + (session.admin ? " (admin)" : "") +
    " · replica " + session.replica_id + " · model " + session.model;
  $("sign-out").hidden = session.open_mode;
  $("open-warning").hidden = !session.open_mode;
  $("open-warning").textContent = session.open_mode ? "Open dev mode: " + session.warning : "";
  $("main").hidden = false;
  $("live-denied").hidden = session.live_view;
  $("live-body").hidden = !session.live_view;
  start();
}

// The key was refused (a wrong key, or one removed from the key file while signed in).
function keyRejected(error) {
  sessionStorage.removeItem(KEY_STORAGE);
  stop();
  consoleState.session = null;
  $("main").hidden = true;
  $("who").textContent = "";
  showMessage("That API key was not accepted (" + (error.code || "unauthorized") + "): " +
              error.message + " Check the key and sign in again.");
}

function signOut() {
  sessionStorage.removeItem(KEY_STORAGE);
  stop();
  consoleState.session = null;
  $("main").hidden = true;
  $("who").textContent = "";
  showMessage("");
}

function start() {
  stop();
  const s = consoleState.session;
  if (s.live_view) {
    ensureCharts();
    refreshLive();
    consoleState.timers.push(setInterval(refreshLive, LIVE_INTERVAL_MS));
  }
  refreshEnvelope();
  refreshLists();
  consoleState.timers.push(setInterval(refreshLists, LISTS_INTERVAL_MS));
}

function stop() {
  for (const timer of consoleState.timers) clearInterval(timer);
  consoleState.timers = [];
}

// ---- live view ---------------------------------------------------------------------------

function chart(target, title, series, valueFormat, yRange) {
  const width = Math.max(320, target.clientWidth || 480);
  const opts = {
    title, width, height: 200,
    scales: { x: { time: true }, y: yRange ? { range: yRange } : {} },
    series: [{}, ...series.map(([label, stroke]) => ({ label, stroke, width: 1.5,
      value: (u, v) => (v === null || v === undefined ? "–" : valueFormat(v)) }))],
    axes: [{}, { values: (u, ticks) => ticks.map(valueFormat), size: 70 }],
  };
  return new uPlot(opts, [[], ...series.map(() => [])], target);
}

function ensureCharts() {
  if (consoleState.charts.queue) return;
  consoleState.charts.queue = chart($("chart-queue"), "Queue depth",
    [["interactive", "#d1495b"], ["bulk", "#2e86de"]], (v) => v.toFixed(0));
  consoleState.charts.ttft = chart($("chart-ttft"), "Interactive TTFT (last minute)",
    [["p50", "#1d7a3a"], ["p99", "#d1495b"]], (v) => (v * 1000).toFixed(0) + " ms");
  consoleState.charts.tokens = chart($("chart-tokens"), "Output tokens/s",
    [["interactive", "#d1495b"], ["bulk", "#2e86de"]], (v) => v.toFixed(0));
  consoleState.charts.kv = chart($("chart-kv"), "KV cache usage",
    [["used", "#7a4fd1"]], (v) => (v * 100).toFixed(0) + "%", [0, 1]);
}

function push(array, value) {
  array.push(value);
  if (array.length > HISTORY_POINTS) array.shift();
}

function record(live) {
  const h = consoleState.history;
  push(h.t, live.now);
  for (const c of CLASSES) {
    push(h.queue[c], live.classes[c].queue_depth);
    push(h.tokens[c], live.classes[c].output_tokens_per_s);
  }
  push(h.ttftP50, live.classes.interactive.ttft_s.p50);
  push(h.ttftP99, live.classes.interactive.ttft_s.p99);
  push(h.kv, live.engine.kv_usage);
  const ch = consoleState.charts;
  ch.queue.setData([h.t, h.queue.interactive, h.queue.bulk]);
  ch.ttft.setData([h.t, h.ttftP50, h.ttftP99]);
  ch.tokens.setData([h.t, h.tokens.interactive, h.tokens.bulk]);
  ch.kv.setData([h.t, h.kv]);
}

function refusalsText(refusals) {
  const parts = Object.entries(refusals).filter(([, n]) => n > 0).map(([code, n]) => code + " " + n);
  return parts.length ? parts.join(", ") : "0";
}

function renderLive(live) {
  $("live-meta").textContent = "replica " + live.replica_id + " · latency over the last " +
    live.window_s.toFixed(0) + " s · rates over " + live.rate_window_s.toFixed(0) + " s" +
    (live.ready ? "" : " · NOT READY: " + live.not_ready_reasons.join("; "));
  const body = $("class-table").tBodies[0];
  body.replaceChildren(...CLASSES.map((c) => {
    const k = live.classes[c];
    const tr = document.createElement("tr");
    tr.id = "class-" + c;
    tr.append(
      cell(c),
      valueCell(`live-${c}-queue_depth`, k.queue_depth, (v) => String(v)),
      valueCell(`live-${c}-queued_tokens`, k.queued_tokens, (v) => String(v)),
      valueCell(`live-${c}-running`, k.running, (v) => String(v)),
      valueCell(`live-${c}-ttft-p50`, k.ttft_s.p50, ms),
      valueCell(`live-${c}-ttft-p99`, k.ttft_s.p99, ms),
      valueCell(`live-${c}-itl-p50`, k.itl_s.p50, ms),
      valueCell(`live-${c}-itl-p99`, k.itl_s.p99, ms),
      valueCell(`live-${c}-ttft-count`, k.ttft_s.count, (v) => String(v)),
      valueCell(`live-${c}-output_tokens_per_s`, k.output_tokens_per_s, (v) => num(v)),
      cell(refusalsText(k.refusals), { id: `live-${c}-refusals` }),
      valueCell(`live-${c}-expired`, k.expired, (v) => String(v)),
    );
    return tr;
  }));
  const e = live.engine;
  const set = (id, value, format) => {
    $(id).textContent = format(value);
    $(id).dataset.value = value === null || value === undefined ? "" : String(value);
  };
  set("engine-kv_usage", e.kv_usage, pct);
  set("engine-step_s", e.step_s, ms);
  set("engine-steps_per_s", e.steps_per_s, (v) => num(v));
  set("engine-tps-interactive_decode", e.tokens_per_step.interactive_decode, (v) => num(v, 2));
  set("engine-tps-bulk_decode", e.tokens_per_step.bulk_decode, (v) => num(v, 2));
  set("engine-tps-prefill",
      e.tokens_per_step.interactive_prefill + e.tokens_per_step.bulk_prefill, (v) => num(v, 1));
  $("engine-preemptions").textContent = e.preemptions + " / " + e.preemptions_total;
  const replicas = $("replica-table").tBodies[0];
  replicas.replaceChildren(...live.replicas.map((r) => {
    const tr = document.createElement("tr");
    tr.dataset.replica = r.replica_id;
    tr.append(
      cell(r.replica_id), cell(r.ready ? "yes" : "no"), cell(r.claims.join(", ")),
      cell(r.running.interactive + " / " + r.running.bulk),
      cell(r.waiting.interactive + " / " + r.waiting.bulk),
      cell(pct(r.kv_usage)), cell(ms(r.step_s)),
      cell(num(r.output_tokens_per_s.interactive) + " / " + num(r.output_tokens_per_s.bulk)),
    );
    return tr;
  }));
}

async function refreshLive() {
  try {
    const live = await api("/console/api/live");
    consoleState.lastLive = live;
    renderLive(live);
    record(live);
  } catch (error) {
    $("live-meta").textContent = "live view unavailable: " + error.message;
  }
}

// ---- envelope ----------------------------------------------------------------------------

async function refreshEnvelope() {
  try {
    const envelope = await api("/console/api/envelope");
    const p = envelope.provenance || {};
    const slo = Object.entries(p.slo || {}).map(([k, v]) => k + " = " + v).join(", ");
    const box = $("envelope-provenance");
    box.replaceChildren();
    const rows = [
      ["source", p.source], ["workload", p.workload || "–"], ["created", p.created_at || "–"],
      ["SLO", slo || "–"], ["notes", p.notes || "–"],
      ["limits", "max_active_seqs " + envelope.max_active_seqs + ", step_token_budget " +
        envelope.step_token_budget + ", TTFT target " +
        ms(envelope.interactive_ttft_target_s)],
    ];
    const table = document.createElement("table");
    for (const [k, v] of rows) {
      const tr = document.createElement("tr");
      tr.append(cell(k), cell(String(v), { id: "envelope-" + k }));
      table.append(tr);
    }
    box.append(table);
    $("envelope-json").textContent = JSON.stringify(envelope, null, 2);
  } catch (error) {
    $("envelope-provenance").textContent = "envelope unavailable: " + error.message;
  }
}

// ---- jobs and batches ------------------------------------------------------------------------

function pageQuery(list) {
  const after = list.cursors[list.index];
  return "?limit=" + PAGE + (after ? "&after=" + encodeURIComponent(after) : "");
}

function wirePager(name, list, refresh) {
  $(name + "-newer").addEventListener("click", () => {
    if (list.index > 0) { list.index -= 1; refresh(); }
  });
  $(name + "-older").addEventListener("click", () => {
    if (list.cursors[list.index + 1]) { list.index += 1; refresh(); }
  });
}

function updatePager(name, list, page) {
  list.cursors[list.index + 1] = page.next_after;
  list.cursors.length = list.index + 2;
  $(name + "-newer").disabled = list.index === 0;
  $(name + "-older").disabled = !page.has_more;
}

function cancelButton(label, onClick) {
  const button = document.createElement("button");
  button.type = "button";
  button.textContent = label;
  button.className = "cancel";
  button.addEventListener("click", async () => {
    button.disabled = true;
    await onClick(button);
  });
  return button;
}

async function refreshJobs() {
  const list = consoleState.jobs;
  try {
    const page = await api("/console/api/jobs" + pageQuery(list));
    updatePager("jobs", list, page);
    $("jobs-table").tBodies[0].replaceChildren(...page.data.map(jobRow));
    $("jobs-message").textContent = page.data.length ? "" : "no jobs";
  } catch (error) {
    $("jobs-message").textContent = "jobs unavailable: " + error.message;
  }
}

function jobRow(job) {
  const tr = document.createElement("tr");
  tr.dataset.jobId = job.id;
  tr.dataset.status = job.status;
  const action = document.createElement("td");
  if (job.status === "queued" || job.status === "running") {
    action.append(cancelButton("Cancel", async (button) => {
      try {
        const answer = await api("/console/api/jobs/" + encodeURIComponent(job.id) + "/cancel",
                                 { method: "POST" });
        tr.dataset.cancel = answer.cancel;
        button.textContent = answer.cancel;
      } catch (error) {
        button.textContent = "failed: " + error.message;
      }
    }));
  }
  tr.append(cell(job.id), cell(job.tenant), cell(job.class),
            cell(job.status, { class: "status-" + job.status }),
            cell(age(job.created_at)),
            cell(TERMINAL_JOB.has(job.status) ? "–" : until(job.deadline_at)),
            cell(String(job.attempts)),
            action);
  return tr;
}

async function refreshBatches() {
  const list = consoleState.batches;
  try {
    const page = await api("/console/api/batches" + pageQuery(list));
    updatePager("batches", list, page);
    $("batches-table").tBodies[0].replaceChildren(...page.data.map(batchRow));
    $("batches-message").textContent = page.data.length ? "" : "no batches";
  } catch (error) {
    $("batches-message").textContent = "batches unavailable: " + error.message;
  }
}

function downloadButton(batch, which) {
  const button = document.createElement("button");
  button.type = "button";
  button.textContent = which;
  button.className = "download-" + which;
  button.addEventListener("click", async () => {
    // fetch with the key (a plain link cannot send the Authorization header), then save.
    const response = await fetch("/console/api/batches/" + encodeURIComponent(batch.id) +
                                 "/files/" + which, { headers: authHeaders() });
    if (!response.ok) { button.textContent = which + ": HTTP " + response.status; return; }
    const url = URL.createObjectURL(await response.blob());
    const link = document.createElement("a");
    link.href = url;
    link.download = batch.id + "-" + which + ".jsonl";
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  });
  return button;
}

function batchRow(batch) {
  const tr = document.createElement("tr");
  tr.dataset.batchId = batch.id;
  tr.dataset.status = batch.status;
  const counts = batch.request_counts;
  const done = counts.completed + counts.failed;
  const progress = document.createElement("td");
  const bar = document.createElement("span");
  bar.className = "bar";
  const fill = document.createElement("span");
  fill.style.width = (counts.total ? (100 * done) / counts.total : 0) + "%";
  bar.append(fill);
  progress.append(bar, " " + counts.completed + " ok, " + counts.failed + " failed / " + counts.total);
  progress.className = "progress";
  const files = document.createElement("td");
  if (batch.output_file_id) files.append(downloadButton(batch, "output"));
  if (batch.error_file_id) files.append(" ", downloadButton(batch, "error"));
  const action = document.createElement("td");
  if (batch.status === "validating" || batch.status === "in_progress") {
    action.append(cancelButton("Cancel", async (button) => {
      try {
        const answer = await api("/console/api/batches/" + encodeURIComponent(batch.id) +
                                 "/cancel", { method: "POST" });
        button.textContent = answer.status;
      } catch (error) {
        button.textContent = "failed: " + error.message;
      }
    }));
  }
  tr.append(cell(batch.id), cell(batch.tenant),
            cell(batch.status, { class: "status-" + batch.status }), progress,
            cell(age(batch.created_at)), cell(until(batch.expires_at)), files, action);
  return tr;
}

function refreshLists() {
  refreshJobs();
  refreshBatches();
}

// ---- chat playground ---------------------------------------------------------------------

async function sendChat(event) {
  event.preventDefault();
  const text = $("chat-input").value.trim();
  if (!text) return;
  const output = $("chat-output");
  output.textContent = "";
  $("chat-status").textContent = "waiting";
  $("chat-ttft").textContent = "–";
  $("chat-tps").textContent = "–";
  $("chat-tokens").textContent = "0";
  $("chat-send").disabled = true;
  const started = performance.now();
  let first = null;
  let tokens = 0;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { ...authHeaders(), "content-type": "application/json" },
      body: JSON.stringify({
        model: consoleState.session.model,
        messages: [{ role: "user", content: text }],
        max_tokens: Number($("chat-max-tokens").value) || 64,
        stream: true,
        stream_options: { include_usage: true },
      }),
    });
    if (!response.ok) {
      const body = await response.json().catch(() => null);
      throw new ApiError(response.status, body);
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of frame.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message || "stream error");
          const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
          if (delta && delta.content) {
            if (first === null) {
              first = performance.now();
              $("chat-ttft").textContent = (first - started).toFixed(0) + " ms";
              $("chat-status").textContent = "streaming";
            }
            tokens += 1;
            output.textContent += delta.content;
          }
          if (chunk.usage) tokens = chunk.usage.completion_tokens;
          $("chat-tokens").textContent = String(tokens);
          if (first !== null && tokens > 1) {
            const seconds = (performance.now() - first) / 1000;
            if (seconds > 0) $("chat-tps").textContent = ((tokens - 1) / seconds).toFixed(1);
          }
        }
      }
    }
    $("chat-status").textContent = "done";
  } catch (error) {
    $("chat-status").textContent = "error: " + error.message;
  } finally {
    $("chat-send").disabled = false;
  }
}

// ---- start-up ----------------------------------------------------------------------------

async function boot() {
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("api-key").value.trim();
    $("api-key").value = "";
    if (!key) { showMessage("Enter an API key."); return; }
    signIn(key);
  });
  $("sign-out").addEventListener("click", signOut);
  $("chat-form").addEventListener("submit", sendChat);
  wirePager("jobs", consoleState.jobs, refreshJobs);
  wirePager("batches", consoleState.batches, refreshBatches);
  let mode = { open_mode: false };
  try { mode = await api("/console/api/mode"); } catch (_) { /* shown by sign-in */ }
  if (mode.open_mode) {
    $("key-form").hidden = true;
    signIn();
  } else if (sessionStorage.getItem(KEY_STORAGE)) {
    signIn();
  } else {
    showMessage("Enter an API key to sign in.");
  }
}

boot();
