// streamkit dashboard: polls api/status (what `streamkit status` shows, as JSON) and
// draws it: tables, the lag and the committed rate of every partition over the last
// minutes (uPlot, vendored), the events seen between two looks (a scale step, a
// processor changing state, a worker coming or going) and, when an autoscaler runs, its
// inputs, decisions and a chart of lag, throughput, workers and processors over time.
"use strict";

const POLL_MS = 1000;
const KEEP_SECONDS = 600;

const state = {
  polls: 0,           // looks answered
  lagPoints: 0,       // points drawn on the lag chart
  events: [],         // [time, text]
  processorCount: null,
  scaling: null,
  states: {},         // processor -> state, as last seen
  workers: {},        // worker -> state, as last seen
  charts: null,       // {lag, rate, series: ["topic/p", ...]}
  times: [],
  lag: {},            // "topic/p" -> [values]
  rate: {},
  lastCommitted: {},  // "topic/p" -> [time, committed]
  autoscale: null,    // {chart, points, decisions}: the autoscaler's part, as last drawn
};
window.streamkitDashboard = state;  // what a test (or a person in the console) reads

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}

function fillTable(id, columns, rows) {
  const table = document.getElementById(id);
  table.replaceChildren();
  const head = el("tr");
  for (const [title] of columns) head.appendChild(el("th", title));
  table.appendChild(head);
  for (const row of rows) {
    const tr = el("tr");
    for (const [, cell] of columns) {
      const value = cell(row);
      if (value instanceof Node) { const td = el("td"); td.appendChild(value); tr.appendChild(td); }
      else tr.appendChild(el("td", String(value), typeof value === "number" ? "num" : undefined));
    }
    table.appendChild(tr);
  }
}

function event(text) {
  state.events.unshift([new Date().toLocaleTimeString(), text]);
  state.events.length = Math.min(state.events.length, 50);
  const list = document.getElementById("events");
  list.replaceChildren(...state.events.map(([t, s]) => el("li", `${t}  ${s}`)));
}

function noteChanges(view) {
  const count = view.processors.length;
  if (state.processorCount !== null && count !== state.processorCount) {
    event(`job scaled from ${state.processorCount} to ${count} processors`);
  }
  state.processorCount = count;
  if (view.scaling !== state.scaling) {
    if (view.scaling) event(`scale step ${view.scaling} started`);
    else if (state.scaling) event(`scale step ${state.scaling} finished`);
    state.scaling = view.scaling;
  }
  for (const p of view.processors) {
    const before = state.states[p.processor];
    if (before !== undefined && before !== p.state) event(`processor ${p.processor}: ${before} -> ${p.state}`);
    state.states[p.processor] = p.state;
  }
  for (const w of view.workers) {
    const before = state.workers[w.worker];
    if (before !== w.state) event(`worker ${w.worker} ${w.state}`);
    state.workers[w.worker] = w.state;
  }
}

function chartOptions(title, series, width) {
  return {
    title, width, height: 260,
    scales: { x: { time: true } },
    series: [{}, ...series.map((name, i) => ({
      label: name, stroke: `hsl(${(i * 67) % 360} 65% 42%)`, width: 1.5, spanGaps: true,
    }))],
    axes: [{}, { size: 70 }],
  };
}

function drawCharts(view) {
  const now = view.at;
  const series = view.partitions.map(p => `${p.topic}/${p.partition}`);
  state.times.push(now);
  for (const p of view.partitions) {
    const key = `${p.topic}/${p.partition}`;
    const before = state.times.length - 1;  // a partition new to the view has no earlier point
    state.lag[key] ||= Array(before).fill(null);
    state.rate[key] ||= Array(before).fill(null);
    const last = state.lastCommitted[key];
    const committed = p.committed ?? 0;
    const rate = last && now > last[0] ? Math.max(0, (committed - last[1]) / (now - last[0])) : null;
    state.lastCommitted[key] = [now, committed];
    state.lag[key].push(p.lag);
    state.rate[key].push(rate);
  }
  for (const key of Object.keys(state.lag)) {  // a partition gone from the view: a gap
    while (state.lag[key].length < state.times.length) { state.lag[key].push(null); state.rate[key].push(null); }
  }
  while (state.times.length && state.times[0] < now - KEEP_SECONDS) {
    state.times.shift();
    for (const key of Object.keys(state.lag)) { state.lag[key].shift(); state.rate[key].shift(); }
  }
  const width = Math.max(420, Math.min(720, (window.innerWidth - 80) / 2));
  const names = Object.keys(state.lag).sort();
  if (!state.charts || state.charts.series.join() !== names.join()) {
    if (state.charts) { state.charts.lag.destroy(); state.charts.rate.destroy(); }
    state.charts = {
      series: names,
      lag: new uPlot(chartOptions("", names, width), [[]], document.getElementById("lag-chart")),
      rate: new uPlot(chartOptions("", names, width), [[]], document.getElementById("rate-chart")),
    };
  }
  state.charts.lag.setData([state.times.slice(), ...names.map(k => state.lag[k].slice())]);
  state.charts.rate.setData([state.times.slice(), ...names.map(k => state.rate[k].slice())]);
  state.lagPoints = state.times.length;
}

const AUTOSCALE_SERIES = [
  ["lag (records)", "y"], ["input records/s", "y"], ["applied records/s", "y"], ["workers", "n"], ["processors", "n"],
];

function autoscaleChart(width) {
  const stepped = uPlot.paths.stepped({ align: 1 });
  return new uPlot({
    width, height: 260,
    scales: { x: { time: true }, n: { range: (u, min, max) => [0, Math.max(1, max) + 1] } },
    series: [{}, ...AUTOSCALE_SERIES.map(([label, scale], i) => ({
      label, scale, stroke: `hsl(${(i * 67 + 200) % 360} 65% 42%)`, width: scale === "n" ? 2.5 : 1.5,
      spanGaps: true, ...(scale === "n" ? { paths: stepped } : {}),
    }))],
    axes: [{}, { scale: "y", size: 70 }, { scale: "n", side: 1, grid: { show: false }, size: 40 }],
  }, [[]], document.getElementById("autoscale-chart"));
}

function drawAutoscale(a) {
  const box = document.getElementById("autoscale");
  box.style.display = a ? "block" : "none";
  if (!a) return;
  const c = a.controller;
  const how = c.workers === "local" ? "local workers" : "workers by gauge";
  const when = new Date(a.at * 1000).toLocaleTimeString();
  document.getElementById("autoscale-head").textContent =
    `${a.running ? "" : "NOT RUNNING: "}${how} ${c.min}..${c.max}, target utilization ${c.target_utilization}` +
    `${c.dry_run ? ", dry run" : ""}, on ${c.host} (pid ${c.pid}), last look ${when}`;
  const i = a.inputs;
  const rates = ("input_rate" in i) ? `, input ${Math.round(i.input_rate)}/s, applied ${Math.round(i.applied_rate)}/s,` +
    ` busy ${i.busy.toFixed(2)}` : "";
  document.getElementById("autoscale-inputs").textContent =
    `inputs: lag ${i.lag} records (${i.lag_seconds.toFixed(1)} s)${rates}, ${i.workers} workers, ` +
    `${i.processors} processors`;
  const d = a.decision;
  document.getElementById("autoscale-decision").textContent = d
    ? `decision: ${d.action}: ${d.workers} workers, ${d.processors} processors: ${d.why}`
    : "decision: none yet";
  fillTable("autoscale-decisions", [
    ["at", r => new Date(r.at * 1000).toLocaleTimeString()],
    ["action", r => r.action === "refused" ? el("span", "refused", "refused") : r.action],
    ["workers", r => r.workers ?? "-"], ["processors", r => r.processors ?? "-"], ["why", r => r.why],
  ], a.decisions.slice().reverse());
  if (!state.autoscale) {
    state.autoscale = { chart: autoscaleChart(Math.max(420, Math.min(900, window.innerWidth - 80))) };
  }
  const h = a.history;
  state.autoscale.chart.setData([
    h.map(p => p.at), h.map(p => p.lag), h.map(p => p.input_rate), h.map(p => p.applied_rate),
    h.map(p => p.workers), h.map(p => p.processors),
  ]);
  state.autoscale.points = h.length;
  state.autoscale.decisions = a.decisions.length;
}

function stateCell(p) {
  const span = el("span", p.hosted ? p.state : `${p.state} (no live worker)`, `state-${p.state}`);
  if (!p.progress) return span;
  const box = el("span");
  const bar = el("progress");
  bar.max = Math.max(1, p.progress.done + p.progress.left);
  bar.value = p.progress.done;
  box.append(span, " ", bar);
  return box;
}

function strays(p) {
  const parts = [];
  if (p.strays_forwarded) parts.push(`${p.strays_forwarded} forwarded`);
  if (p.strays_waiting) parts.push(`${p.strays_waiting} waiting`);
  if (p.strays_dead) parts.push(`${p.strays_dead} misplaced (dead letters)`);
  return parts.join(", ") || "-";
}

function render(view) {
  document.getElementById("title").textContent =
    `app ${view.app}` + (view.job_epoch !== null ? ` (job epoch ${view.job_epoch}, p0 ${view.p0})` : "");
  document.getElementById("asof").textContent =
    `as of ${new Date(view.at * 1000).toLocaleTimeString()}, consumer group ${view.group}`;
  const banner = document.getElementById("scaling");
  banner.style.display = view.scaling ? "block" : "none";
  banner.textContent = view.scaling ? `scaling ${view.scaling} processors` : "";
  fillTable("workers", [
    ["worker", w => w.worker], ["state", w => w.state], ["processors", w => w.processors.join(", ") || "-"],
    ["handled", w => w.handled], ["dead letters", w => w.dead_letters],
    ["failing run", w => w.failing ? el("span", `${w.failing_run} FAILING`, "warn") : w.failing_run],
    ["last error", w => w.last_error],
  ], view.workers);
  fillTable("processors", [
    ["processor", p => p.processor], ["state", stateCell], ["worker", p => p.worker], ["detail", p => p.detail],
  ], view.processors);
  fillTable("partitions", [
    ["topic", p => p.topic], ["partition", p => p.partition], ["mode", p => p.mode],
    ["processor", p => p.processors.join(", ") || "-"], ["keys", p => p.keys],
    ["committed", p => p.committed ?? "-"], ["IC ranges", p => p.ic_ranges],
    ["high watermark", p => p.high_watermark], ["lag", p => p.lag], ["strays", strays],
  ], view.partitions);
  const reasons = Object.entries(view.dead_letters);
  fillTable("dead-letters", [["reason", r => r[0]], ["records", r => r[1]]],
            reasons.length ? reasons : [["-", 0]]);
  noteChanges(view);
  drawCharts(view);
  drawAutoscale(view.autoscale);
}

// The job's query token, when the dashboard asks for one: from the address's fragment
// (URL#token=TOKEN), which the browser never sends to a server or keeps in its logs.
// Not URLSearchParams: it would read a "+" of a base64 token as a space.
const TOKEN_IN_HASH = location.hash.match(/[#&]token=([^&]*)/);
const TOKEN = TOKEN_IN_HASH ? decodeURIComponent(TOKEN_IN_HASH[1]) : null;

async function poll() {
  try {
    const headers = TOKEN ? { Authorization: `Bearer ${TOKEN}` } : {};
    const reply = await fetch("api/status", { cache: "no-store", headers });
    const body = await reply.json();
    if (reply.status === 401) throw new Error(`${body.error}: open this page as its address + #token=TOKEN`);
    if (!reply.ok) throw new Error(body.error || reply.statusText);
    document.getElementById("error").textContent = "";
    render(body);
    state.polls += 1;
  } catch (err) {
    document.getElementById("error").textContent = `cannot read the job's status: ${err.message}`;
  }
  setTimeout(poll, POLL_MS);
}

poll();
