// The live SLO page (crates/server/src/ui): polls GET /slo/status each second and
// renders it; the chat box streams POST /v1/chat/completions (SSE read from fetch)
// and shows each answer's TTFT and TPOT as measured here. With API keys the page
// asks for one, keeps it in sessionStorage and sends it as a Bearer header.
"use strict";

const KEY = "sloserve-api-key";
const POLL_MS = 1000;
const RATE_WINDOW_MS = 5000;
const $ = (id) => document.getElementById(id);

// ---- API key -----------------------------------------------------------------

function authHeaders(extra) {
  const key = sessionStorage.getItem(KEY);
  return key ? { ...extra, Authorization: "Bearer " + key } : { ...extra };
}

function askForKey() {
  $("key-form").hidden = false;
  $("key-input").focus();
}

$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(KEY, $("key-input").value.trim());
  $("key-input").value = "";
  $("key-form").hidden = true;
  poll();
});

// ---- formatting ----------------------------------------------------------------

// Durations in one unit, chosen by the largest: "12 / 40 / 85 ms", "1.25 / 3.40 s".
function durations(values) {
  const top = Math.max(...values);
  if (top >= 1) return values.map((s) => s.toFixed(2)).join(" / ") + " s";
  const digits = top < 0.01 ? 1 : 0;
  return values.map((s) => (s * 1000).toFixed(s === 0 ? 0 : digits)).join(" / ") + " ms";
}

function ms(seconds) {
  return seconds == null ? "—" : durations([seconds]);
}

function percentiles(l) {
  return l.count ? durations([l.p50_s, l.p90_s, l.p99_s]) : "—";
}

function pct(part, whole) {
  return whole ? ((100 * part) / whole).toFixed(1) + "%" : "—";
}

function rate(met, missed) {
  const n = met + missed;
  return n ? pct(met, n) : "—";
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

// p90 against the class's default target: green within, red past it.
function verdict(l, targetMs) {
  if (targetMs == null || !l.count) return "";
  return l.p90_s * 1000 <= targetMs ? "ok" : "bad";
}

// ---- tokens/s from two readings of the counters --------------------------------

const readings = [];

function tokensPerSecond(status) {
  const now = performance.now();
  // A restarted server counts from zero again.
  if (readings.length && readings[0].status.started !== status.started) readings.length = 0;
  readings.push({ at: now, status });
  while (readings.length > 2 && now - readings[1].at >= RATE_WINDOW_MS) readings.shift();
  const old = readings[0];
  const dt = (now - old.at) / 1000;
  if (dt <= 0) return null;
  const byClass = {};
  status.classes.forEach((c, i) => {
    byClass[c.class] = (c.tokens_after_first - old.status.classes[i].tokens_after_first) / dt;
  });
  return { byClass, total: (status.generation_tokens - old.status.generation_tokens) / dt };
}

// ---- rendering -----------------------------------------------------------------

function renderClasses(status, rates) {
  const body = $("classes").tBodies[0];
  body.replaceChildren();
  for (const c of status.classes) {
    const tr = document.createElement("tr");
    tr.id = "class-" + c.class;
    const a = c.attainment;
    const f = c.finished;
    const tps = rates ? rates.byClass[c.class] : null;
    tr.append(
      cell(c.class),
      cell(percentiles(c.ttft), "ttft " + verdict(c.ttft, c.ttft_target_ms)),
      cell(c.ttft_target_ms == null ? "—" : c.ttft_target_ms + " ms"),
      cell(percentiles(c.tpot), "tpot " + verdict(c.tpot, c.tpot_target_ms)),
      cell(c.tpot_target_ms == null ? "—" : c.tpot_target_ms + " ms"),
      cell(rate(a.ttft_met, a.ttft_missed) + " · " + rate(a.tpot_met, a.tpot_missed)),
      cell(c.running),
      cell(c.waiting),
      cell(ms(c.predicted_wait_s)),
      cell(tps == null ? "—" : tps.toFixed(1)),
      cell(f.stop + f.length, "finished"),
      cell(c.rejected),
    );
    tr.cells[5].title = `TTFT met ${a.ttft_met}, missed ${a.ttft_missed}; TPOT met ${a.tpot_met}, missed ${a.tpot_missed}`;
    tr.cells[10].title = `stop ${f.stop}, length ${f.length}, error ${f.error}, aborted ${f.abort}`;
    body.append(tr);
  }
}

function renderCapacity(status, rates) {
  const kv = status.kv;
  $("kv-bar").style.width = (100 * kv.usage).toFixed(1) + "%";
  $("kv").textContent =
    `${kv.blocks_used} of ${kv.blocks_total} blocks in use (${pct(kv.blocks_used, kv.blocks_total)}), ` +
    `${kv.block_size} tokens each; ${kv.cached_idle_blocks} idle blocks cached`;
  const pc = status.prefix_cache;
  $("prefix").textContent =
    `hit rate ${pct(pc.hit_tokens, pc.queried_tokens)} (${pc.hit_tokens.toLocaleString()} of ` +
    `${pc.queried_tokens.toLocaleString()} prompt tokens); ${kv.prefix_cache_blocks} blocks`;
  const gen = rates ? rates.total.toFixed(1) : "—";
  $("throughput").textContent =
    `generating ${gen} tokens/s; prefill ${Math.round(status.prefill_tokens_per_s).toLocaleString()} tokens/s ` +
    `(measured); ${status.generation_tokens.toLocaleString()} tokens since start`;
}

function renderBatches(batch) {
  const body = $("batches").tBodies[0];
  body.replaceChildren();
  if (!batch) {
    $("batch-counts").textContent = "(Batch API off)";
    return;
  }
  const counts = Object.entries(batch.jobs).map(([s, n]) => `${n} ${s}`);
  $("batch-counts").textContent = counts.length ? "all owners: " + counts.join(", ") : "none yet";
  if (!batch.running.length) {
    const tr = document.createElement("tr");
    const td = cell("no running jobs of this key", "dim");
    td.colSpan = 6;
    tr.append(td);
    body.append(tr);
  }
  for (const j of batch.running) {
    const done = j.completed + j.failed;
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.append(document.createElement("div"));
    bar.firstChild.style.width = pct(done, j.total).replace("—", "0%");
    const progress = cell(" " + pct(done, j.total));
    progress.prepend(bar);
    const tr = document.createElement("tr");
    tr.append(
      cell(j.id), cell(j.status), progress,
      cell(`${done} / ${j.total}` + (j.failed ? ` (${j.failed} failed)` : "")),
      cell(j.tokens_per_second == null ? "—" : j.tokens_per_second.toFixed(1)),
      cell(j.eta_seconds == null ? "—" : Math.round(j.eta_seconds) + " s"),
    );
    body.append(tr);
  }
}

function setConn(text, cls) {
  $("conn").textContent = text;
  $("conn").className = "badge " + cls;
}

async function poll() {
  try {
    const r = await fetch("/slo/status", { headers: authHeaders(), cache: "no-store" });
    if (r.status === 401) {
      setConn("API key needed", "down");
      askForKey();
      return;
    }
    if (!r.ok) throw new Error("HTTP " + r.status);
    const status = await r.json();
    const rates = tokensPerSecond(status);
    $("model").textContent = status.model;
    renderClasses(status, rates);
    renderCapacity(status, rates);
    renderBatches(status.batch);
    setConn("live · " + new Date().toLocaleTimeString(), "live");
  } catch (e) {
    setConn("unreachable: " + e.message, "down");
  }
}

// ---- chat ------------------------------------------------------------------------

const history = [];

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  $("chat-log").append(div);
  $("chat-log").scrollTop = $("chat-log").scrollHeight;
  return div;
}

// Yields each `data:` payload of a Server-Sent Events body.
async function* sseData(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, end);
      buf = buf.slice(end + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data:")) yield line.slice(5).trim();
      }
    }
  }
}

async function errorText(r) {
  try {
    const j = await r.json();
    return (j.error && j.error.message) || "HTTP " + r.status;
  } catch {
    return "HTTP " + r.status;
  }
}

async function send(text, sloClass) {
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const answer = addMessage("assistant", "");
  answer.id = "answer-" + history.length;
  const timing = document.createElement("div");
  timing.className = "timing";
  answer.after(timing);
  const t0 = performance.now();
  let first = null, last = null, chunks = 0, usage = null;
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: authHeaders({ "Content-Type": "application/json" }),
      body: JSON.stringify({
        messages: history, stream: true, max_tokens: 256, slo_class: sloClass,
        stream_options: { include_usage: true },
      }),
    });
    if (r.status === 401) askForKey();
    if (!r.ok) throw new Error(await errorText(r));
    for await (const data of sseData(r.body)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        last = performance.now();
        if (first == null) first = last;
        chunks += 1;
        answer.textContent += delta.content;
        timing.textContent = `TTFT ${ms((first - t0) / 1000)} · streaming…`;
      }
    }
    history.push({ role: "assistant", content: answer.textContent });
  } catch (e) {
    answer.classList.add("error");
    answer.textContent += (answer.textContent ? "\n" : "") + "error: " + e.message;
    history.pop();
  }
  // TPOT: time after the first token over the tokens after it (usage's count
  // when the server sent one, else the content chunks seen).
  const tokens = usage ? usage.completion_tokens : chunks;
  const tpot = first != null && tokens > 1 ? (last - first) / 1000 / (tokens - 1) : null;
  timing.textContent = first == null ? "no tokens" :
    `TTFT ${ms((first - t0) / 1000)} · TPOT ${ms(tpot)} · ${tokens} tokens (measured in this browser)`;
  timing.dataset.done = "1";
}

$("chat-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const text = $("chat-input").value.trim();
  if (!text) return;
  $("chat-input").value = "";
  $("chat-send").disabled = true;
  await send(text, $("chat-class").value);
  $("chat-send").disabled = false;
  $("chat-input").focus();
});

$("chat-input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("chat-form").requestSubmit();
  }
});

poll();
setInterval(poll, POLL_MS);
