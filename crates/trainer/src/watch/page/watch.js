// tinygpt watch: runs followed through server-sent events, drawn on canvases. No framework.
'use strict';

const $ = (id) => document.getElementById(id);
const key = new URLSearchParams(location.search).get('key');
const query = key ? '?key=' + encodeURIComponent(key) : '';
const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#17becf', '#8c564b', '#e377c2'];
// steps[i] = [step, loss, lr, grad_norm, tokens_per_s, skipped, elapsed_s]
const runs = [];
window.watch = { runs };

function apply(event) {
  let run = runs[event.run];
  if (!run) {
    run = runs[event.run] = { name: event.name, color: COLORS[event.run % COLORS.length], visible: true, steps: [], evals: [] };
  }
  if (event.reset) { run.steps = []; run.evals = []; }
  run.steps.push(...event.steps);
  run.evals.push(...event.evals);
}

const source = new EventSource('events' + query);
source.onopen = () => { $('status').textContent = 'live'; };
source.onerror = () => { $('status').textContent = 'disconnected: retrying…'; };
source.onmessage = (message) => {
  try { apply(JSON.parse(message.data)); schedule(); } catch (e) { $('error').textContent = String(e); }
};

let drawing = false;
function schedule() {
  if (drawing) return;
  drawing = true;
  requestAnimationFrame(() => { drawing = false; render(); });
}

function render() {
  legend();
  lossChart();
  fill($('att-run'), runs.map((r) => r.name));
  fill($('sample-run'), runs.map((r) => r.name));
  attention();
  samples();
}

// Options of a select, keeping what is selected.
function fill(select, labels) {
  if (select.options.length === labels.length) return;
  const kept = select.value;
  select.replaceChildren(...labels.map((label, i) => new Option(label, String(i))));
  if (kept !== '' && Number(kept) < labels.length) select.value = kept;
}

function legend() {
  const body = $('legend').tBodies[0];
  body.replaceChildren(...runs.map((run, i) => {
    const last = run.steps[run.steps.length - 1];
    const vals = run.evals.map((e) => e.val_loss);
    const row = document.createElement('tr');
    const toggle = document.createElement('input');
    toggle.type = 'checkbox';
    toggle.checked = run.visible;
    toggle.dataset.run = String(i);
    toggle.onchange = () => { run.visible = toggle.checked; schedule(); };
    const cells = [toggle, `<span class="swatch" style="background:${run.color}"></span> ${escape(run.name)}`,
      last ? last[0] : '-', last ? last[1].toFixed(4) : '-',
      vals.length ? Math.min(...vals).toFixed(4) : '-', last ? Math.round(last[4]) : '-'];
    for (const cell of cells) {
      const td = document.createElement('td');
      if (cell instanceof Node) td.append(cell); else td.innerHTML = String(cell);
      row.append(td);
    }
    return row;
  }));
}

function escape(text) {
  return text.replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' }[c]));
}

// A canvas at the screen's resolution, its 2-D context in CSS pixels.
function context(canvas, height) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 600;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const ctx = canvas.getContext('2d');
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return [ctx, width];
}

function smoothed(values, alpha) {
  let s = null;
  return values.map((v) => (s = s === null ? v : alpha * s + (1 - alpha) * v));
}

function ticks(lo, hi, count) {
  const step = Math.pow(10, Math.floor(Math.log10((hi - lo) / count || 1)));
  const nice = [1, 2, 5, 10].map((m) => m * step).find((s) => (hi - lo) / s <= count) || step * 10;
  const out = [];
  for (let t = Math.ceil(lo / nice) * nice; t <= hi + 1e-9; t += nice) out.push(t);
  return out;
}

function lossChart() {
  const canvas = $('loss');
  const [ctx, width] = context(canvas, 360);
  const height = 360, left = 56, right = 12, top = 10, bottom = 34;
  const log = $('log').checked, alpha = Number($('smooth').value);
  $('smooth-value').textContent = alpha.toFixed(2);
  const shown = runs.filter((r) => r.visible);
  const y = (v) => (log ? Math.log10(v) : v);
  const points = shown.flatMap((r) => [...r.steps.map((s) => [s[0], s[1]]), ...r.evals.map((e) => [e.step, e.val_loss])])
    .filter((p) => Number.isFinite(p[1]) && p[1] > 0);
  ctx.clearRect(0, 0, width, height);
  canvas.dataset.points = String(shown.reduce((n, r) => n + r.steps.length, 0));
  canvas.dataset.runs = String(shown.filter((r) => r.steps.length + r.evals.length > 0).length);
  if (points.length === 0) {
    ctx.fillStyle = '#888';
    ctx.fillText('waiting for the first logged step…', left + 10, top + 20);
    return;
  }
  const maxStep = Math.max(1, ...points.map((p) => p[0]));
  let lo = Math.min(...points.map((p) => y(p[1]))), hi = Math.max(...points.map((p) => y(p[1])));
  if (hi - lo < 1e-6) { lo -= 0.5; hi += 0.5; }
  const pad = (hi - lo) * 0.05;
  lo -= pad; hi += pad;
  const X = (s) => left + (s / maxStep) * (width - left - right);
  const Y = (v) => top + (1 - (y(v) - lo) / (hi - lo)) * (height - top - bottom);
  ctx.strokeStyle = '#ddd'; ctx.fillStyle = '#555'; ctx.lineWidth = 1; ctx.font = '12px system-ui, sans-serif';
  for (const t of ticks(0, maxStep, Math.max(2, Math.floor(width / 110)))) {
    const px = X(t);
    ctx.beginPath(); ctx.moveTo(px, top); ctx.lineTo(px, height - bottom); ctx.stroke();
    ctx.textAlign = 'center'; ctx.fillText(String(Math.round(t)), px, height - bottom + 16);
  }
  for (const t of ticks(lo, hi, 6)) {
    const py = top + (1 - (t - lo) / (hi - lo)) * (height - top - bottom);
    ctx.beginPath(); ctx.moveTo(left, py); ctx.lineTo(width - right, py); ctx.stroke();
    ctx.textAlign = 'right'; ctx.fillText((log ? Math.pow(10, t) : t).toFixed(2), left - 6, py + 4);
  }
  ctx.textAlign = 'center'; ctx.fillText('step', (left + width) / 2, height - 4);
  for (const run of shown) {
    const steps = run.steps.filter((s) => Number.isFinite(s[1]) && s[1] > 0);
    const losses = smoothed(steps.map((s) => s[1]), alpha);
    ctx.strokeStyle = run.color; ctx.globalAlpha = 0.55; ctx.lineWidth = 1.2;
    ctx.beginPath();
    steps.forEach((s, i) => (i ? ctx.lineTo(X(s[0]), Y(losses[i])) : ctx.moveTo(X(s[0]), Y(losses[i]))));
    ctx.stroke();
    ctx.globalAlpha = 1; ctx.lineWidth = 2.5; ctx.fillStyle = run.color;
    ctx.beginPath();
    run.evals.forEach((e, i) => (i ? ctx.lineTo(X(e.step), Y(e.val_loss)) : ctx.moveTo(X(e.step), Y(e.val_loss))));
    ctx.stroke();
    for (const e of run.evals) {
      ctx.beginPath(); ctx.arc(X(e.step), Y(e.val_loss), 3.5, 0, 2 * Math.PI); ctx.fill();
    }
  }
}

function attention() {
  const run = runs[Number($('att-run').value || 0)];
  const canvas = $('heatmap');
  const evals = run ? run.evals.filter((e) => e.attention && e.attention.length) : [];
  const slider = $('eval');
  if (evals.length === 0) { $('eval-value').textContent = 'no attention recorded yet'; return; }
  // Follow the newest evaluation while the slider is at the end.
  const atEnd = Number(slider.value) >= Number(slider.max);
  slider.max = String(evals.length - 1);
  if (atEnd) slider.value = slider.max;
  const e = evals[Number(slider.value)];
  fill($('layer'), e.attention.map((_, i) => 'layer ' + i));
  fill($('head'), e.attention[0].map((_, i) => 'head ' + i));
  const layer = Number($('layer').value || 0), head = Number($('head').value || 0);
  const weights = e.attention[layer][head];
  const n = e.prompt.length;
  $('eval-value').textContent = `step ${e.step} · val ${e.val_loss.toFixed(4)} (${Number(slider.value) + 1} of ${evals.length})`;
  $('prompt').textContent = e.prompt.join(' ');
  const cell = Math.max(1, Math.floor(320 / n));
  canvas.width = canvas.height = cell * n;
  const ctx = canvas.getContext('2d');
  ctx.fillStyle = '#fff';
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  for (let q = 0; q < n; q++) {
    for (let k = 0; k <= q; k++) {
      const w = weights[q * n + k] / 255;
      const c = Math.round(255 * (1 - w));
      ctx.fillStyle = `rgb(${c},${c},255)`;
      ctx.fillRect(k * cell, q * cell, cell, cell);
    }
  }
  canvas.dataset.drawn = `${e.step}/${layer}/${head}`;
}

function samples() {
  const run = runs[Number($('sample-run').value || 0)];
  const list = $('samples');
  if (!run) return;
  const withText = run.evals.filter((e) => e.sample);
  if (list.dataset.shown === `${run.name}/${withText.length}`) return;
  list.dataset.shown = `${run.name}/${withText.length}`;
  list.replaceChildren(...withText.map((e) => {
    const div = document.createElement('div');
    div.className = 'sample';
    div.innerHTML = `<b>step ${e.step}</b> · val ${e.val_loss.toFixed(4)}<pre><span class="prompt"></span><span class="text"></span></pre>`;
    div.querySelector('.prompt').textContent = e.prompt.join('').replaceAll('␣', ' ').replaceAll('⏎', '\n');
    div.querySelector('.text').textContent = e.sample;
    return div;
  }));
}

for (const id of ['log', 'smooth', 'att-run', 'layer', 'head', 'eval', 'sample-run']) {
  $(id).addEventListener('input', schedule);
  $(id).addEventListener('change', schedule);
}
window.addEventListener('resize', schedule);
