// The tinygpt playground: streams completions from /v1/completions (server-sent events) and
// draws the attention weights from /v1/attention. Plain JavaScript, no libraries.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { info: null, controller: null, attention: null, focus: null, painted: new Map() };

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api_key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function showError(message) {
  $("error").textContent = message || "";
  $("error").hidden = !message;
}

async function apiError(response) {
  try {
    const body = await response.json();
    return body.error ? body.error.message : response.statusText;
  } catch (_) {
    return response.status + " " + response.statusText;
  }
}

async function loadInfo() {
  const info = await (await fetch("/health")).json();
  state.info = info;
  $("model-info").textContent =
    `${info.model}: ${info.n_layer} layers × ${info.n_head} heads, n_embd ${info.n_embd}, ` +
    `block_size ${info.block_size}, ${info.tokenizer} tokenizer (${info.vocab_size} tokens)`;
  $("key-label").hidden = !info.api_key_required;
  $("max_tokens").max = info.max_tokens;
  const layer = $("layer");
  for (let l = 0; l < info.n_layer; l++) layer.add(new Option(String(l), String(l)));
  const head = $("head");
  head.add(new Option("all", "all"));
  for (let h = 0; h < info.n_head; h++) head.add(new Option(String(h), String(h)));
}

function number(id) {
  const v = $(id).value.trim();
  return v === "" ? undefined : Number(v);
}

function request() {
  const body = {
    prompt: $("prompt").value,
    max_tokens: number("max_tokens"),
    temperature: number("temperature"),
    top_k: number("top_k"),
    top_p: number("top_p"),
    repetition_penalty: number("repetition_penalty"),
    context_shift: $("context_shift").checked,
    stream: true,
    stream_options: { include_usage: true },
  };
  const seed = number("seed");
  if (seed !== undefined) body.seed = seed;
  return body;
}

async function generate() {
  showError("");
  $("out-prompt").textContent = $("prompt").value;
  $("out-text").textContent = "";
  $("generate").disabled = true;
  $("stop").disabled = false;
  state.controller = new AbortController();
  const started = performance.now();
  let first = null;
  let tokens = 0;
  try {
    const response = await fetch("/v1/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(request()),
      signal: state.controller.signal,
    });
    if (!response.ok) throw new Error(await apiError(response));
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        if (!event.startsWith("data: ")) continue;
        const data = event.slice(6);
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.usage) tokens = chunk.usage.completion_tokens;
        for (const choice of chunk.choices) {
          if (choice.text) {
            if (first === null) first = performance.now();
            $("out-text").textContent += choice.text;
          }
        }
      }
      const seconds = (performance.now() - started) / 1000;
      $("status").textContent = `${seconds.toFixed(1)} s`;
    }
    const seconds = (performance.now() - started) / 1000;
    const ttft = first === null ? "-" : `${Math.round(first - started)} ms`;
    $("status").textContent =
      `${tokens} tokens in ${seconds.toFixed(2)} s (${(tokens / seconds).toFixed(0)} tokens/s), first token after ${ttft}`;
    await showAttention();
  } catch (e) {
    if (e.name === "AbortError") $("status").textContent = "stopped";
    else showError(e.message);
  } finally {
    $("generate").disabled = false;
    $("stop").disabled = true;
    state.controller = null;
  }
}

// The attention of the whole text (prompt and completion), its last block_size tokens.
async function showAttention() {
  showError("");
  const text = $("out-prompt").textContent + $("out-text").textContent || $("prompt").value;
  const response = await fetch("/v1/attention", {
    method: "POST",
    headers: headers(),
    body: JSON.stringify({ prompt: text, layer: Number($("layer").value), truncate: true }),
  });
  if (!response.ok) {
    showError(await apiError(response));
    return;
  }
  state.attention = await response.json();
  state.painted = new Map();
  const n = state.attention.tokens.length;
  state.focus = state.focus !== null && state.focus < n ? state.focus : n - 1;
  drawTokens();
  drawHeatmaps();
}

// Row `q` of the selected head: the weights query `q` gives keys 0..=q.
function row(head, q) {
  return state.attention.attention[0][head][q];
}

function selectedHeads() {
  const h = $("head").value;
  return h === "all" ? state.attention.heads : [Number(h)];
}

function drawTokens() {
  const box = $("tokens");
  box.replaceChildren();
  state.attention.tokens.forEach((token, i) => {
    const span = document.createElement("span");
    span.textContent = token === "\n" ? "↵" : token;
    span.dataset.i = String(i);
    span.addEventListener("mouseenter", () => focus(i));
    span.addEventListener("click", () => focus(i));
    box.append(span);
  });
  shadeTokens();
}

function focus(i) {
  state.focus = i;
  shadeTokens();
  drawHeatmaps();
}

// Shade each token by the weight the focused token gives it (averaged over the heads shown).
function shadeTokens() {
  const a = state.attention;
  const q = state.focus;
  const heads = selectedHeads();
  const weights = new Array(q + 1).fill(0);
  for (const h of heads) row(h, q).forEach((w, k) => (weights[k] += w / heads.length));
  const max = Math.max(...weights, 1e-9);
  $("tokens").querySelectorAll("span").forEach((span) => {
    const k = Number(span.dataset.i);
    span.classList.toggle("future", k > q);
    span.classList.toggle("focus", k === q);
    span.style.background = k <= q ? `rgba(33, 86, 196, ${(0.85 * weights[k]) / max})` : "";
    span.style.color = k <= q && weights[k] / max > 0.55 ? "white" : "";
    span.title = k <= q ? `weight ${weights[k].toFixed(4)}` : "masked: a token never sees the future";
  });
  const top = weights
    .map((w, k) => [w, k])
    .sort((x, y) => y[0] - x[0])
    .slice(0, 3)
    .map(([w, k]) => `${JSON.stringify(a.tokens[k])} (${k}) ${w.toFixed(2)}`);
  const label = heads.length > 1 ? `mean of ${heads.length} heads` : `head ${heads[0]}`;
  $("focus").textContent =
    `token ${q} ${JSON.stringify(a.tokens[q])}, layer ${a.layers[0]}, ${label}: most attention to ${top.join(", ")}`;
}

// Head `h`'s whole matrix at `cell` pixels a weight, painted once per attention result:
// hovering only moves the outline, so it must not repaint n² cells of every head.
function matrix(h, cell) {
  const key = `${h}/${cell}`;
  if (state.painted.has(key)) return state.painted.get(key);
  const n = state.attention.tokens.length;
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = cell * n;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "white";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  for (let q = 0; q < n; q++) {
    row(h, q).forEach((w, k) => {
      const shade = Math.round(255 * (1 - Math.sqrt(w)));
      ctx.fillStyle = `rgb(${shade}, ${shade}, 255)`;
      ctx.fillRect(k * cell, q * cell, cell, cell);
    });
  }
  state.painted.set(key, canvas);
  return canvas;
}

// One heatmap per head shown: rows are queries, columns keys; white above the diagonal.
function drawHeatmaps() {
  const box = $("heatmaps");
  box.replaceChildren();
  const heads = selectedHeads();
  const n = state.attention.tokens.length;
  const side = heads.length > 1 ? 160 : Math.min(480, box.clientWidth || 480);
  const cell = Math.max(1, Math.floor(side / n));
  for (const h of heads) {
    const figure = document.createElement("figure");
    const canvas = document.createElement("canvas");
    canvas.width = canvas.height = cell * n;
    canvas.dataset.head = String(h);
    const ctx = canvas.getContext("2d");
    ctx.drawImage(matrix(h, cell), 0, 0);
    ctx.strokeStyle = "#d92d20";
    ctx.lineWidth = Math.max(1, cell / 4);
    ctx.strokeRect(0, state.focus * cell, canvas.width, cell);
    canvas.addEventListener("click", (e) => {
      const r = canvas.getBoundingClientRect();
      const q = Math.floor(((e.clientY - r.top) / r.height) * n);
      if (heads.length > 1) $("head").value = String(h);
      focus(Math.min(n - 1, Math.max(0, q)));
    });
    const caption = document.createElement("figcaption");
    caption.textContent = `layer ${state.attention.layers[0]}, head ${h}`;
    figure.append(canvas, caption);
    box.append(figure);
  }
  box.dataset.drawn = String(heads.length);
}

$("generate").addEventListener("click", generate);
$("stop").addEventListener("click", () => state.controller && state.controller.abort());
$("show-attention").addEventListener("click", showAttention);
$("layer").addEventListener("change", () => state.attention && showAttention());
$("head").addEventListener("change", () => {
  if (!state.attention) return;
  shadeTokens();
  drawHeatmaps();
});
loadInfo().catch((e) => showError("cannot reach the server: " + e.message));
