/* gluejobs dashboard: plain JavaScript over the /v1 API, no build step, nothing fetched from the
 * network but this server. Views: #/ (jobs), #/jobs/<id> (one job, live), #/compare?ids=1,2 ,
 * #/sweeps and #/sweeps/<id> (median and spread over seeds per configuration).
 * Charts are uPlot (vendored in static/vendor). */
"use strict";

const KEY_STORAGE = "gluejobs.apiKey";
const LIST_REFRESH_MS = 2000;
const STATUSES = ["queued", "running", "cancelling", "succeeded", "failed", "cancelled"];
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const LOG_TAIL_CHARS = 60000;
const MAX_EVENTS_SHOWN = 400;
const COLORS = ["#2f6fdf", "#d9622b", "#1f8a4c", "#8e44ad", "#c23b3b", "#16a2b8", "#b7791f", "#5d6d7e"];

let viewCleanup = () => {};

// ------------------------------------------------------------------------------------------------
// The API, with the key kept in this tab's sessionStorage
// ------------------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.code = error.code;
    this.field = error.field;
  }
}

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORAGE);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    headers: { Accept: "application/json", ...authHeaders(), ...(options.headers || {}) },
  });
  if (response.status === 401) {
    await askForKey(sessionStorage.getItem(KEY_STORAGE) ? "That key was refused." : "");
    return api(path, options);
  }
  const text = await response.text();
  const body = text && (response.headers.get("content-type") || "").includes("json") ? JSON.parse(text) : text;
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

let keyPrompt = null;
function askForKey(message) {
  // One prompt, however many requests were refused at once.
  if (keyPrompt) return keyPrompt;
  const dialog = document.getElementById("key-dialog");
  document.getElementById("key-error").textContent = message;
  keyPrompt = new Promise((resolve) => {
    const form = document.getElementById("key-form");
    form.onsubmit = (event) => {
      event.preventDefault();
      sessionStorage.setItem(KEY_STORAGE, document.getElementById("key-input").value.trim());
      dialog.close();
      keyPrompt = null;
      showWho();
      resolve();
    };
  });
  if (!dialog.open) dialog.showModal();
  return keyPrompt;
}

function showWho() {
  document.getElementById("whoami").textContent = sessionStorage.getItem(KEY_STORAGE) ? "signed in with an API key" : "";
}

/* The live stream (GET /v1/jobs/{id}/stream). The browser's EventSource cannot send an
 * Authorization header, so the stream is read with fetch and its Server-Sent Events parsed here
 * (event, data, id fields; comments skipped); a dropped connection resumes with Last-Event-ID. */
function openStream(jobId, { logs = false, onEvent, onEnd }) {
  const controller = new AbortController();
  let lastId = null;
  let stopped = false;
  const run = async () => {
    while (!stopped) {
      try {
        const headers = { Accept: "text/event-stream", ...authHeaders() };
        if (lastId) headers["Last-Event-ID"] = lastId;
        const response = await fetch(`v1/jobs/${jobId}/stream${logs ? "?logs=true" : ""}`, {
          headers, signal: controller.signal,
        });
        if (response.status === 401) { await askForKey("That key was refused."); continue; }
        if (!response.ok) throw new ApiError(response.status, await response.json());
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        let event = { event: "message", data: [], id: null };
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let newline;
          while ((newline = buffer.search(/\r\n|\r|\n/)) >= 0) {
            const line = buffer.slice(0, newline);
            buffer = buffer.slice(newline + (buffer.startsWith("\r\n", newline) ? 2 : 1));
            if (line === "") {
              if (event.data.length) {
                if (event.id !== null) lastId = event.id;
                const data = JSON.parse(event.data.join("\n"));
                if (event.event === "end") { stopped = true; onEnd && onEnd(data); return; }
                onEvent(event.event, data);
              }
              event = { event: "message", data: [], id: null };
            } else if (!line.startsWith(":")) {
              const colon = line.indexOf(":");
              const name = colon < 0 ? line : line.slice(0, colon);
              const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
              if (name === "event") event.event = text;
              else if (name === "data") event.data.push(text);
              else if (name === "id") event.id = text;
            }
          }
        }
      } catch (error) {
        if (stopped || error.name === "AbortError") return;
        if (error instanceof ApiError) { onEnd && onEnd({ error: error.message }); return; }
      }
      await sleep(2000); // reconnect after the given retry interval
    }
  };
  run();
  return () => { stopped = true; controller.abort(); };
}

// ------------------------------------------------------------------------------------------------
// Small helpers
// ------------------------------------------------------------------------------------------------

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function h(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) element.addEventListener(key.slice(2), value);
    else if (key === "class") element.className = value;
    // Through the CSSOM: the page's Content-Security-Policy refuses style attributes.
    else if (key === "style") Object.assign(element.style, value);
    else element.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

const fmt = (value, digits = 4) => (value === null || value === undefined ? "—" : Number(value).toFixed(digits));
const statusBadge = (status) => h("span", { class: `status ${status}`, "data-status": status }, status);
const taskOf = (job) => job.spec.task_name || job.spec.train_file || "";

function duration(job) {
  if (!job.started_at) return "";
  const end = job.finished_at ? new Date(job.finished_at) : new Date();
  const seconds = Math.max(0, Math.round((end - new Date(job.started_at)) / 1000));
  const hours = Math.floor(seconds / 3600);
  const minutes = Math.floor((seconds % 3600) / 60);
  return hours ? `${hours}h${String(minutes).padStart(2, "0")}m` : `${minutes}m${String(seconds % 60).padStart(2, "0")}s`;
}

const when = (iso) => (iso ? new Date(iso).toLocaleString() : "");

/* The task's main metric: its newest evaluation, and the best one where that differs. */
function headline(job) {
  const metric = job.headline_metric;
  if (!metric) return "";
  const latest = ((job.latest_metrics || {}).eval || {})[metric.name] ?? metric.value;
  if (latest === null || latest === undefined) return metric.name;
  const best = metric.best;
  return `${metric.name} ${fmt(latest)}${best !== null && best !== undefined && best !== latest ? ` (best ${fmt(best)})` : ""}`;
}

/* Axis ticks that stay readable for learning rates (1e-5) as for losses (0.69). */
const tick = (value) => (value !== 0 && Math.abs(value) < 0.01 ? value.toExponential(1) : String(+value.toPrecision(4)));

/* Optimizer steps: the training loop announces its total in an event ({max_train_steps}); a
 * finished job reports the steps it completed. */
const maxStepsCache = new Map();
async function maxSteps(job) {
  if (job.result && job.result.completed_steps) return job.result.completed_steps;
  if (job.spec.max_train_steps) return job.spec.max_train_steps;
  if (maxStepsCache.has(job.id)) return maxStepsCache.get(job.id);
  if (job.status !== "running" && job.status !== "cancelling") return null;
  const page = await api(`v1/jobs/${job.id}/events?limit=100`);
  const found = page.data.find((e) => e.data && e.data.max_train_steps);
  if (found) maxStepsCache.set(job.id, found.data.max_train_steps);
  return found ? found.data.max_train_steps : null;
}

function progressCell(job, total) {
  const train = (job.latest_metrics || {}).train || {};
  if (train.step === undefined) return h("span", { class: "muted" }, job.status === "queued" ? "waiting" : "");
  const share = total ? Math.min(1, train.step / total) : 0;
  return h("span", {},
    total ? h("span", { class: "bar" }, h("span", { style: { width: `${(share * 100).toFixed(1)}%` } })) : null,
    `step ${train.step}${total ? ` / ${total}` : ""} · epoch ${fmt(train.epoch, 2)}`);
}

// ------------------------------------------------------------------------------------------------
// Charts
// ------------------------------------------------------------------------------------------------

/* A uPlot chart that grows as rows arrive: series are {label, points: [[x, y], ...]}. */
class Chart {
  constructor(container, title, xLabel) {
    this.container = container;
    this.xLabel = xLabel;
    this.series = new Map();
    this.plot = null;
    this.box = h("div", { class: "chart", "data-chart": title, "data-points": "0" }, h("h3", {}, title),
      h("div", { class: "empty" }, "no points yet"));
    container.append(this.box);
  }

  add(label, x, y) {
    if (!this.series.has(label)) this.series.set(label, new Map());
    this.series.get(label).set(x, y);
    this.dirty = true;
  }

  render() {
    if (!this.dirty) return;
    this.dirty = false;
    const labels = [...this.series.keys()];
    const tables = labels.map((label) => {
      const points = [...this.series.get(label).entries()].sort((a, b) => a[0] - b[0]);
      return [points.map((p) => p[0]), points.map((p) => p[1])];
    });
    const data = uPlot.join(tables);
    const count = tables.reduce((sum, table) => sum + table[0].length, 0);
    this.box.setAttribute("data-points", String(count));
    if (this.plot && this.plot.series.length - 1 === labels.length) {
      this.plot.setData(data);
      return;
    }
    if (this.plot) this.plot.destroy();
    this.box.querySelector(".empty")?.remove();
    const width = Math.max(320, this.box.clientWidth - 16);
    this.plot = new uPlot({
      width, height: 220,
      scales: { x: { time: false } },
      axes: [{ label: this.xLabel }, { values: (_u, values) => values.map(tick), size: 60 }],
      series: [{ label: this.xLabel }, ...labels.map((label, i) => ({
        label, stroke: COLORS[i % COLORS.length], width: 2, points: { show: true, size: 5 }, spanGaps: true,
      }))],
    }, data, this.box);
  }

  destroy() { if (this.plot) this.plot.destroy(); }
}

// ------------------------------------------------------------------------------------------------
// Jobs
// ------------------------------------------------------------------------------------------------

async function jobsView(view, params) {
  const status = params.get("status") || "";
  const selected = new Set();
  const filter = h("select", { id: "status-filter", onchange: (e) => { location.hash = e.target.value ? `#/?status=${e.target.value}` : "#/"; } },
    h("option", { value: "" }, "every status"), STATUSES.map((s) => h("option", { value: s, selected: s === status }, s)));
  const compare = h("button", { id: "compare-selected", disabled: true, onclick: () => { location.hash = `#/compare?ids=${[...selected].join(",")}`; } }, "Compare selected");
  const body = h("tbody", { id: "jobs-body" });
  const more = h("p", { class: "muted" });
  view.append(h("h1", {}, "Jobs"), h("div", { class: "toolbar" }, h("label", {}, "status ", filter), compare),
    h("table", { id: "jobs" }, h("thead", {}, h("tr", {}, ["", "id", "status", "task / files", "model", "metric", "progress", "duration", "created"].map((c) => h("th", {}, c)))), body), more);

  let timer = null;
  let alive = true;
  const refresh = async () => {
    try {
      const page = await api(`v1/jobs?limit=100${status ? `&status=${status}` : ""}`);
      const totals = await Promise.all(page.data.map((job) => maxSteps(job).catch(() => null)));
      body.replaceChildren(...page.data.map((job, i) => h("tr", { class: "job-row", "data-job": job.id },
        h("td", {}, h("input", { type: "checkbox", checked: selected.has(job.id), onchange: (e) => {
          if (e.target.checked) selected.add(job.id); else selected.delete(job.id);
          compare.disabled = selected.size < 2;
        } })),
        h("td", { class: "num" }, h("a", { href: `#/jobs/${job.id}` }, job.id)),
        h("td", {}, statusBadge(job.status)),
        h("td", {}, taskOf(job)),
        h("td", {}, job.spec.model_name_or_path),
        h("td", { class: "num" }, headline(job)),
        h("td", {}, progressCell(job, totals[i])),
        h("td", {}, duration(job)),
        h("td", { class: "muted" }, when(job.created_at)))));
      if (!page.data.length) body.replaceChildren(h("tr", {}, h("td", { colspan: 9, class: "muted" }, "no jobs yet")));
      more.textContent = page.has_more ? "showing the newest 100" : "";
    } catch (error) {
      more.textContent = `could not load the jobs: ${error.message}`;
    }
    if (alive) timer = setTimeout(refresh, LIST_REFRESH_MS);
  };
  await refresh();
  return () => { alive = false; clearTimeout(timer); };
}

// ------------------------------------------------------------------------------------------------
// One job, live
// ------------------------------------------------------------------------------------------------

async function jobView(view, jobId) {
  let job = await api(`v1/jobs/${jobId}`);
  const facts = h("div", { class: "facts" });
  const title = h("h1", {});
  const cancel = h("button", { id: "cancel", class: "danger", onclick: async () => {
    cancel.disabled = true;
    try { job = await api(`v1/jobs/${jobId}/cancel`, { method: "POST" }); renderHeader(); }
    catch (error) { notice.textContent = error.message; }
  } }, "Cancel");
  const again = h("button", { id: "submit-again", onclick: async () => {
    const created = await api("v1/jobs", {
      method: "POST", headers: { "Content-Type": "application/json", "Idempotency-Key": crypto.randomUUID() },
      body: JSON.stringify({ spec: job.spec, priority: job.priority, max_attempts: job.max_attempts,
        metadata: { ...job.metadata, resubmitted_from: String(job.id) } }),
    });
    location.hash = `#/jobs/${created.id}`;
  } }, "Submit again");
  const notice = h("p", { class: "error", id: "job-error" });
  const charts = h("div", { class: "charts" });
  const checkpointsBody = h("tbody", { id: "checkpoints" });
  const events = h("ul", { class: "events", id: "events" });
  const log = h("pre", { class: "log", id: "log" });
  const artifacts = h("tbody", { id: "artifacts" });
  view.append(
    h("div", { class: "toolbar" }, title, cancel, again, h("a", { href: `#/compare?ids=${jobId}` }, "compare…")),
    h("div", { class: "card" }, facts, notice),
    h("h2", {}, "Curves"), charts,
    h("div", { class: "two" },
      h("div", {}, h("h2", {}, "Checkpoints"), h("table", {}, h("thead", {}, h("tr", {}, ["step", "epoch", "metrics", ""].map((c) => h("th", {}, c)))), checkpointsBody)),
      h("div", {}, h("h2", {}, "Artifacts"), h("table", {}, h("thead", {}, h("tr", {}, ["path", "kind", "size"].map((c) => h("th", {}, c)))), artifacts))),
    h("div", { class: "two" },
      h("div", {}, h("h2", {}, "Events"), events),
      h("div", {}, h("h2", {}, "Log"), log)),
    h("h2", {}, "Resolved spec"), h("pre", { id: "spec" }, JSON.stringify(job.spec, null, 2)));

  let total = await maxSteps(job).catch(() => null);
  function renderHeader() {
    title.replaceChildren(`Job ${job.id} `, statusBadge(job.status));
    cancel.disabled = TERMINAL.has(job.status) || job.status === "cancelling";
    const train = (job.latest_metrics || {}).train || {};
    facts.replaceChildren(...[
      ["task / files", taskOf(job)], ["model", job.spec.model_name_or_path],
      ["progress", progressCell(job, total)], ["metric", headline(job) || "—"],
      ["attempts", `${job.attempts} of ${job.max_attempts}`], ["worker", job.worker_id || "—"],
      ["created", when(job.created_at)], ["started", when(job.started_at) || "—"],
      ["finished", when(job.finished_at) || "—"], ["duration", duration(job) || "—"],
      ["seed", job.spec.seed], ["train loss", fmt(train.loss)],
    ].map(([label, value]) => h("div", {}, h("span", {}, label), value)));
    notice.textContent = job.error ? `${job.error_code ? `${job.error_code}: ` : ""}${job.error}` : "";
  }
  renderHeader();

  const loss = new Chart(charts, "loss", "step");
  const lr = new Chart(charts, "learning_rate", "step");
  const evalCharts = new Map();
  const evalChart = (name) => {
    if (!evalCharts.has(name)) evalCharts.set(name, new Chart(charts, `eval ${name}`, "epoch"));
    return evalCharts.get(name);
  };
  const renderCharts = () => { loss.render(); lr.render(); evalCharts.forEach((chart) => chart.render()); };

  const refreshCheckpoints = async () => {
    const [list, files] = await Promise.all([api(`v1/jobs/${jobId}/checkpoints`), api(`v1/jobs/${jobId}/artifacts`)]);
    checkpointsBody.replaceChildren(...list.data.map((c) => h("tr", { "data-step": c.step, class: c.is_best ? "best" : "" },
      h("td", { class: "num" }, c.step), h("td", { class: "num" }, fmt(c.epoch, 2)),
      h("td", {}, Object.entries(c.metrics).map(([k, v]) => `${k} ${fmt(v)}`).join(", ")),
      h("td", {}, c.is_best ? "★ best" : ""))));
    if (!list.data.length) checkpointsBody.replaceChildren(h("tr", {}, h("td", { colspan: 4, class: "muted" }, "none yet")));
    artifacts.replaceChildren(...files.data.filter((f) => f.kind !== "checkpoint").map((f) => h("tr", {},
      h("td", {}, h("a", { href: "#", onclick: (e) => { e.preventDefault(); download(jobId, f.path); } }, f.path)),
      h("td", {}, f.kind), h("td", { class: "num" }, `${(f.size / 1024).toFixed(1)} KiB`))));
  };
  await refreshCheckpoints();

  let logText = "";
  const addEvent = (e) => {
    const item = h("li", { class: e.level }, h("span", { class: "time" }, new Date(e.created_at).toLocaleTimeString()), e.message);
    events.append(item);
    while (events.children.length > MAX_EVENTS_SHOWN) events.firstChild.remove();
    events.scrollTop = events.scrollHeight;
    if (e.data && e.data.max_train_steps) total = e.data.max_train_steps;
  };
  let renderTimer = null;
  let jobChanged = false;
  const refreshJob = async () => { job = await api(`v1/jobs/${jobId}`); renderHeader(); };
  const scheduleRender = () => {
    if (renderTimer) return;
    renderTimer = setTimeout(() => {
      renderTimer = null;
      renderCharts();
      renderHeader();
      // An evaluation may have a new best: the job itself says (one GET, at most every 250 ms).
      if (jobChanged) { jobChanged = false; refreshJob().catch(() => {}); }
    }, 250);
  };

  const close = openStream(jobId, {
    logs: true,
    onEvent: (kind, data) => {
      if (kind === "metric") {
        if (data.split === "train" && data.name === "loss") loss.add("train", data.step, data.value);
        else if (data.split === "train" && data.name === "learning_rate") lr.add("train", data.step, data.value);
        else if (data.split !== "train") { evalChart(data.name).add(data.split, data.epoch, data.value); jobChanged = true; }
        const latest = (job.latest_metrics[data.split] ||= {});
        if (data.step >= (latest.step ?? -1)) Object.assign(latest, { [data.name]: data.value, step: data.step, epoch: data.epoch });
        scheduleRender();
      } else if (kind === "status") {
        addEvent(data);
        refreshJob().catch(() => {});
      } else if (kind === "checkpoint") {
        addEvent({ ...data, level: "info", message: `checkpoint at step ${data.step}${data.is_best ? " (best so far)" : ""}` });
        refreshCheckpoints().catch(() => {});
      } else if (kind === "event") {
        addEvent(data);
        if (data.kind === "checkpoint") refreshCheckpoints().catch(() => {});
      } else if (kind === "log") {
        logText = (logText + data.text).slice(-LOG_TAIL_CHARS);
        log.textContent = logText;
        log.scrollTop = log.scrollHeight;
      }
    },
    onEnd: () => { refreshJob().catch(() => {}); refreshCheckpoints().catch(() => {}); renderCharts(); },
  });
  return () => { close(); clearTimeout(renderTimer); loss.destroy(); lr.destroy(); evalCharts.forEach((c) => c.destroy()); };
}

async function download(jobId, path) {
  // Through fetch, so the API key goes along; a folder arrives as a .tar.
  const response = await fetch(`v1/jobs/${jobId}/artifacts/${path}`, { headers: authHeaders() });
  if (!response.ok) return;
  const blob = await response.blob();
  const link = h("a", { href: URL.createObjectURL(blob), download: path.split("/").pop() + ((response.headers.get("content-type") || "").includes("x-tar") ? ".tar" : "") });
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

// ------------------------------------------------------------------------------------------------
// Compare: several jobs' eval curves overlaid, their final metrics side by side
// ------------------------------------------------------------------------------------------------

async function compareView(view, params) {
  const ids = (params.get("ids") || "").split(",").map((s) => parseInt(s, 10)).filter((n) => n > 0);
  const input = h("input", { id: "compare-ids", value: ids.join(","), placeholder: "job ids, e.g. 3,5,8", size: 30 });
  view.append(h("h1", {}, "Compare jobs"),
    h("div", { class: "toolbar" }, input, h("button", { class: "primary", onclick: () => { location.hash = `#/compare?ids=${input.value.replace(/\s/g, "")}`; } }, "Compare")));
  if (!ids.length) { view.append(h("p", { class: "muted" }, "Pick jobs on the jobs page, or type their ids.")); return () => {}; }
  const jobs = await Promise.all(ids.map((id) => api(`v1/jobs/${id}`)));
  const charts = h("div", { class: "charts" });
  const byName = new Map();
  for (const job of jobs) {
    const rows = [];
    for (const split of ["eval", "eval_mismatched"]) {
      let after = null;
      for (;;) {
        const page = await api(`v1/jobs/${job.id}/metrics?split=${split}&limit=1000${after ? `&after=${after}` : ""}`);
        rows.push(...page.data);
        if (!page.has_more) break;
        after = page.next_cursor;
      }
    }
    for (const row of rows) {
      if (!byName.has(row.name)) byName.set(row.name, new Chart(charts, `eval ${row.name}`, "epoch"));
      byName.get(row.name).add(`job ${job.id}${row.split === "eval" ? "" : " mismatched"}`, row.epoch, row.value);
    }
  }
  const names = [...new Set(jobs.flatMap((job) => Object.keys((job.latest_metrics || {}).eval || {})))].filter((n) => n !== "step" && n !== "epoch");
  view.append(h("h2", {}, "Final metrics"),
    h("table", { id: "compare-table" },
      h("thead", {}, h("tr", {}, h("th", {}, "metric"), jobs.map((job) => h("th", {}, h("a", { href: `#/jobs/${job.id}` }, `job ${job.id}`), " ", statusBadge(job.status))))),
      h("tbody", {},
        h("tr", {}, h("td", {}, "task / model"), jobs.map((job) => h("td", {}, `${taskOf(job)} · ${job.spec.model_name_or_path}`))),
        names.map((name) => h("tr", {}, h("td", {}, name), jobs.map((job) => {
          const value = ((job.latest_metrics || {}).eval || {})[name];
          const best = job.best_metrics && job.best_metrics.metrics ? job.best_metrics.metrics[name] : undefined;
          return h("td", { class: "num" }, fmt(value), best !== undefined && best !== value ? h("span", { class: "muted" }, ` (best ${fmt(best)})`) : null);
        }))))),
    h("h2", {}, "Evaluation curves"), charts);
  byName.forEach((chart) => chart.render());
  return () => byName.forEach((chart) => chart.destroy());
}

// ------------------------------------------------------------------------------------------------
// Sweeps: one row per configuration, the median and spread of each metric over its seeds
// ------------------------------------------------------------------------------------------------

const sweepTask = (sweep) => sweep.spec.task_name || sweep.spec.train_file || "";
const configLabel = (configuration) => {
  const entries = Object.entries(configuration);
  return entries.length ? entries.map(([k, v]) => `${k}=${v}`).join(", ") : "base spec";
};
const countsText = (counts) => Object.entries(counts).filter(([, n]) => n).map(([s, n]) => `${n} ${s}`).join(" · ");

async function sweepsView(view) {
  const body = h("tbody", { id: "sweeps-body" });
  const note = h("p", { class: "muted" });
  view.append(h("h1", {}, "Sweeps"),
    h("table", { id: "sweeps" }, h("thead", {}, h("tr", {}, ["id", "status", "task / files", "model", "seeds", "grid", "jobs", "created"].map((c) => h("th", {}, c)))), body), note);
  let timer = null;
  let alive = true;
  const refresh = async () => {
    try {
      const page = await api("v1/sweeps?limit=100");
      body.replaceChildren(...page.data.map((sweep) => h("tr", { class: "sweep-row", "data-sweep": sweep.id },
        h("td", { class: "num" }, h("a", { href: `#/sweeps/${sweep.id}` }, sweep.id)),
        h("td", {}, statusBadge(sweep.status)),
        h("td", {}, sweepTask(sweep)),
        h("td", {}, sweep.spec.model_name_or_path),
        h("td", {}, sweep.seeds.join(", ")),
        h("td", {}, Object.entries(sweep.grid).map(([k, v]) => `${k}: ${v.join(", ")}`).join("; ")),
        h("td", {}, countsText(sweep.job_counts)),
        h("td", { class: "muted" }, when(sweep.created_at)))));
      if (!page.data.length) body.replaceChildren(h("tr", {}, h("td", { colspan: 8, class: "muted" }, "no sweeps yet (gluejobs sweep …)")));
      note.textContent = page.has_more ? "showing the newest 100" : "";
    } catch (error) {
      note.textContent = `could not load the sweeps: ${error.message}`;
    }
    if (alive) timer = setTimeout(refresh, LIST_REFRESH_MS);
  };
  await refresh();
  return () => { alive = false; clearTimeout(timer); };
}

/* A cell: the median over seeds, and its spread (± sample std, min–max) beneath it. */
function summaryCell(summary, isWinner) {
  if (!summary) return h("td", { class: "num muted" }, "—");
  const spread = summary.n > 1 ? `± ${fmt(summary.std)} · ${fmt(summary.min)}–${fmt(summary.max)} · n=${summary.n}` : "n=1";
  return h("td", { class: `num${isWinner ? " best" : ""}`, "data-median": summary.median },
    fmt(summary.median), h("div", { class: "spread muted" }, spread));
}

async function sweepView(view, sweepId) {
  const content = h("div", {});
  view.append(content);
  let timer = null;
  let alive = true;
  const render = (sweep) => {
    const winner = sweep.winner ? configLabel(sweep.winner.configuration) : null;
    const configurations = sweep.configurations || [];
    const splits = [...new Set(configurations.flatMap((c) => Object.keys(c.final)))].sort();
    const columns = splits.flatMap((split) => [...new Set(configurations.flatMap((c) => Object.keys(c.final[split] || {})))].sort().map((name) => [split, name]));
    const cancel = h("button", { class: "danger", id: "cancel-sweep", disabled: TERMINAL.has(sweep.status), onclick: async () => {
      cancel.disabled = true;
      render(await api(`v1/sweeps/${sweepId}/cancel`, { method: "POST" }));
    } }, "Cancel sweep");
    const table = h("table", { id: "sweep-table" },
      h("thead", {}, h("tr", {}, h("th", {}, "configuration"), h("th", {}, "seeds"), h("th", {}, "jobs"),
        columns.map(([split, name]) => h("th", { class: "num" }, `${split === "eval" ? "" : `${split} `}${name}${name === sweep.main_metric ? " ★" : ""}`)))),
      h("tbody", {}, configurations.map((c) => {
        const label = configLabel(c.configuration);
        return h("tr", { class: "config-row", "data-winner": label === winner },
          h("td", {}, label, label === winner ? h("span", { class: "best" }, " winner") : null),
          h("td", { class: "num" }, `${c.seeds_evaluated} / ${c.seeds.length}`),
          h("td", {}, h("a", { href: `#/compare?ids=${c.job_ids.join(",")}` }, countsText(c.job_counts))),
          columns.map(([split, name]) => summaryCell((c.final[split] || {})[name], label === winner && name === sweep.main_metric)));
      })));
    content.replaceChildren(
      h("div", { class: "toolbar" }, h("h1", {}, `Sweep ${sweep.id} `, statusBadge(sweep.status)), cancel,
        h("a", { href: `#/compare?ids=${sweep.job_ids.join(",")}` }, "compare all its jobs…")),
      h("div", { class: "card facts" },
        [["task / files", sweepTask(sweep)], ["model", sweep.spec.model_name_or_path], ["seeds", sweep.seeds.join(", ")],
         ["ranked by", sweep.main_metric], ["jobs", countsText(sweep.job_counts)], ["created", when(sweep.created_at)]]
          .map(([k, v]) => h("div", {}, h("span", {}, k), v))),
      h("h2", {}, "Final evaluation: median over seeds (± std · min–max)"),
      configurations.length ? table : h("p", { class: "muted" }, "no configuration has an evaluation yet"),
      sweep.winner ? h("p", { id: "sweep-winner" }, `Winner on ${sweep.winner.metric}: ${winner} — median ${fmt(sweep.winner.median)} over ${sweep.winner.seeds_evaluated} seed(s).`) : null);
    return sweep;
  };
  const refresh = async () => {
    let sweep = null;
    try { sweep = render(await api(`v1/sweeps/${sweepId}`)); } catch (error) { content.replaceChildren(h("p", { class: "error" }, error.message)); }
    if (alive && !(sweep && TERMINAL.has(sweep.status))) timer = setTimeout(refresh, LIST_REFRESH_MS);
  };
  await refresh();
  return () => { alive = false; clearTimeout(timer); };
}

// ------------------------------------------------------------------------------------------------
// Routing
// ------------------------------------------------------------------------------------------------

let routeToken = 0;
async function route() {
  viewCleanup();
  viewCleanup = () => {};
  const token = ++routeToken;
  const view = document.getElementById("view");
  view.replaceChildren();
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(query || "");
  const match = path.match(/^\/jobs\/(\d+)$/);
  const sweepMatch = path.match(/^\/sweeps\/(\d+)$/);
  try {
    let cleanup;
    if (match) cleanup = await jobView(view, parseInt(match[1], 10));
    else if (path === "/compare") cleanup = await compareView(view, params);
    else if (sweepMatch) cleanup = await sweepView(view, parseInt(sweepMatch[1], 10));
    else if (path === "/sweeps") cleanup = await sweepsView(view);
    else cleanup = await jobsView(view, params);
    // The user may have moved on while this view was loading: stop it at once then.
    if (token === routeToken) viewCleanup = cleanup; else cleanup();
  } catch (error) {
    if (token === routeToken) view.append(h("p", { class: "error" }, error.message));
  }
}

window.addEventListener("hashchange", route);
showWho();
route();
