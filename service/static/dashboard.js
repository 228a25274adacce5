/* gluejobs dashboard: plain JavaScript over the /v1 API, no build step, nothing fetched from the
 * network but this server. Views: #/ (jobs), #/jobs/<id> (one job, live), #/compare?ids=1,2 (the
 * hyperparameters that differ, metrics, curves overlaid), #/sweeps and #/sweeps/<id> (median and
 * spread over seeds per configuration, at the best and at the final evaluation), #/searches and
 * #/searches/<id> (searches.js).
 * Charts are uPlot (vendored in static/vendor); terminal.js renders logs, resubmit.js the
 * "Submit again" form. The job statuses (STATUSES, and the finished ones: TERMINAL) come from the
 * server's wire.js, loaded first: the server's own words, never a copy. */
"use strict";

const KEY_STORAGE = "gluejobs.apiKey";
const LIST_REFRESH_MS = 2000;
const LOG_TAIL_LINES = 500; // read at first; the stream adds to them
const LOG_LINES_SHOWN = 2000;
const RENDER_MS = 250;
const CLOCK_MS = 5000;
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

/* The response, once a key the server takes is in hand. */
async function send(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    headers: { Accept: "application/json", ...authHeaders(), ...(options.headers || {}) },
  });
  if (response.status === 401) {
    await askForKey(sessionStorage.getItem(KEY_STORAGE) ? "That key was refused." : "");
    return send(path, options);
  }
  return response;
}

async function api(path, options = {}) {
  const response = await send(path, options);
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

/* Every row of a cursor-paged list (GET …/metrics, …/events) after the cursor `after`, oldest first. */
async function readAll(path, after = null) {
  const rows = [];
  for (;;) {
    const page = await api(`${path}${path.includes("?") ? "&" : "?"}limit=10000${after ? `&after=${after}` : ""}`);
    rows.push(...page.data);
    if (!page.has_more) return rows;
    after = page.next_cursor;
  }
}

/* The live stream (GET /v1/jobs/{id}/stream). The browser's EventSource cannot send an
 * Authorization header, so the stream is read with fetch and its Server-Sent Events parsed here
 * (event, data, id fields; comments skipped); it starts after `from` (a Last-Event-ID: where the
 * page's own reads ended) and a dropped connection resumes with the last id received. */
function openStream(jobId, { logs = false, from = null, onEvent, onEnd }) {
  const controller = new AbortController();
  let lastId = from;
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
        if (response.status === 429 || response.status === 503) { // not now: the key's open streams, a database away
          await sleep(1000 * Math.min(60, Number(response.headers.get("Retry-After")) || 5));
          continue;
        }
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
  return add(element, ...children);
}

/* Children appended as h() takes them: nodes, text, nested arrays; null, undefined and false skipped. */
function add(element, ...children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

/* The element's children replaced, taken as add() takes them. */
function fill(element, ...children) {
  element.replaceChildren();
  return add(element, ...children);
}

const fmt = (value, digits = 4) => (value === null || value === undefined ? "—" : Number(value).toFixed(digits));
const statusBadge = (status) => h("span", { class: `status ${status}`, "data-status": status }, status);
/* What a job trains on: its GLUE task, or its data files by the names they were uploaded under (the
 * spec holds an upload's id, file-1, which tells its reader nothing). */
const fileNames = (job) => [...new Set((job.data_files || []).map((f) => f.filename))];
const taskOf = (job) => job.spec.task_name || fileNames(job).join(", ") || job.spec.train_file || "";
/* What a job does: train, or for a job with do_train false eval / predict (the job_kind the API fills
 * into its spec; shared/jobspec/spec.py's job_kind is the rule). */
const jobKind = (job) => (["eval", "predict"].includes(job.spec.job_kind) ? job.spec.job_kind : "train");
const KIND_TEXT = {
  train: "train",
  eval: "eval: the model as loaded, evaluated (no training)",
  predict: "predict: the model as loaded, predicting (no training)",
};
const kindBadge = (job) => (jobKind(job) === "train" ? null : h("span", { class: "kind muted", "data-kind": jobKind(job) }, ` · ${jobKind(job)}`));

/* The spec's column mapping ("text ← review, label ← sentiment"): which columns of the files train. */
const MAPPED_COLUMNS = [["text_column", "text"], ["text_pair_column", "text pair"], ["label_column", "label"]];
const mappingText = (spec) => MAPPED_COLUMNS.filter(([field]) => spec[field]).map(([field, role]) => `${role} ← ${spec[field]}`).join(", ");
const fileText = (f) => `${f.field.replace(/_file$/, "")}: ${f.filename}${f.bytes !== null && f.bytes !== undefined ? ` (${(f.bytes / 1024).toFixed(1)} KiB)` : ""}`;

/* A job's status, and for a trial its search's pruner stopped, "pruned" with where and a link to the
 * search (its status is cancelled, which alone reads as if someone had cancelled it); a failed job's
 * error code beneath, its message on hover. */
function jobStatus(job) {
  const pruned = job.pruned;
  if (pruned) {
    return h("span", { class: "job-status" },
      h("span", { class: "status pruned", "data-status": job.status, "data-pruned": "" }, job.status === "cancelling" ? "pruning" : "pruned"), " ",
      h("a", { href: `#/searches/${pruned.search_id}`, class: "search-link", "data-search": pruned.search_id }, `search ${pruned.search_id}`),
      h("div", { class: "muted stopped", title: job.error || "" }, `trial ${pruned.trial}, stopped at step ${pruned.step} (evaluation ${pruned.evaluation})`));
  }
  return h("span", { class: "job-status" }, statusBadge(job.status),
    job.status === "failed" && job.error_code ? h("div", { class: "muted failure", title: plainText(job.error || "") }, job.error_code.replace(/_/g, " ")) : null);
}

function duration(job) {
  if (!job.started_at) return "";
  const end = job.finished_at ? new Date(job.finished_at) : new Date();
  const seconds = Math.max(0, Math.round((end - new Date(job.started_at)) / 1000));
  const hours = Math.floor(seconds / 3600);
  const minutes = Math.floor((seconds % 3600) / 60);
  return hours ? `${hours}h${String(minutes).padStart(2, "0")}m` : `${minutes}m${String(seconds % 60).padStart(2, "0")}s`;
}

const when = (iso) => (iso ? new Date(iso).toLocaleString() : "");

/* Which evaluation a job's newest one is: the final one once the job has ended, else the latest so
 * far (the API's latest_metrics); beside it, always named, the best (best_metrics). */
const lastEval = (job) => (TERMINAL.has(job.status) ? "final" : "latest");

/* The task's main metric at the newest evaluation and at the best one, each labelled. */
function headline(job) {
  const metric = job.headline_metric;
  if (!metric) return "";
  const latest = ((job.latest_metrics || {}).eval || {})[metric.name] ?? metric.value;
  const best = metric.best;
  const parts = [];
  if (latest !== null && latest !== undefined) parts.push(`${lastEval(job)} ${fmt(latest)}`);
  if (best !== null && best !== undefined) parts.push(`best ${fmt(best)}`);
  return parts.length ? `${metric.name}: ${parts.join(" · ")}` : metric.name;
}

/* Axis ticks that stay readable for learning rates (1e-5) as for losses (0.69). */
const tick = (value) => (value !== 0 && Math.abs(value) < 0.01 ? value.toExponential(1) : String(+value.toPrecision(4)));

/* Optimizer steps: the training loop announces its total in an event ({max_train_steps}); a
 * finished job reports the steps it completed. */
const maxStepsCache = new Map();
const announcedSteps = (events) => (events.find((e) => e.data && e.data.max_train_steps) || { data: {} }).data.max_train_steps ?? null;
const knownSteps = (job) => (job.result && job.result.completed_steps) || job.spec.max_train_steps || maxStepsCache.get(job.id) || null;
async function maxSteps(job) {
  const known = knownSteps(job);
  if (known || (job.status !== "running" && job.status !== "cancelling")) return known;
  const found = announcedSteps((await api(`v1/jobs/${job.id}/events?limit=100`)).data);
  if (found) maxStepsCache.set(job.id, found);
  return found;
}

/* Why a queued job has not started (the API's waiting_for: quota, reservation, devices, retry_backoff). */
const waitingText = (job) => (job.waiting_for && job.waiting_for.message) || "waiting";

function progressCell(job, total) {
  if (jobKind(job) !== "train" && job.status !== "queued") {
    return h("span", { class: "muted" }, (job.latest_metrics || {}).eval ? "evaluated" : "");
  }
  const train = (job.latest_metrics || {}).train || {};
  if (train.step === undefined) {
    if (job.status !== "queued") return h("span", { class: "muted" }, "");
    return h("span", { class: "muted waiting", "data-waiting": (job.waiting_for || {}).reason || "" }, waitingText(job));
  }
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
  const owners = ownersPanel();
  view.append(h("h1", {}, "Jobs"), owners.panel, h("div", { class: "toolbar" }, h("label", {}, "status ", filter), compare),
    h("table", { id: "jobs" }, h("thead", {}, h("tr", {}, ["", "id", "owner", "status", "task / files", "model", "metric", "progress", "duration", "created"].map((c) => h("th", {}, c)))), body), more);

  let timer = null;
  let alive = true;
  const refresh = async () => {
    try {
      const [page] = await Promise.all([api(`v1/jobs?limit=100${status ? `&status=${status}` : ""}`), owners.refresh()]);
      const totals = await Promise.all(page.data.map((job) => maxSteps(job).catch(() => null)));
      body.replaceChildren(...page.data.map((job, i) => h("tr", { class: "job-row", "data-job": job.id },
        h("td", {}, h("input", { type: "checkbox", checked: selected.has(job.id), onchange: (e) => {
          if (e.target.checked) selected.add(job.id); else selected.delete(job.id);
          compare.disabled = selected.size < 2;
        } })),
        h("td", { class: "num" }, h("a", { href: `#/jobs/${job.id}` }, job.id)),
        h("td", { class: "owner" }, job.owner ?? "—"),
        h("td", {}, jobStatus(job)),
        h("td", { class: "wrap" }, taskOf(job), kindBadge(job)),
        h("td", { class: "wrap" }, job.spec.model_name_or_path),
        h("td", { class: "num metric wrap" }, headline(job)),
        h("td", {}, progressCell(job, totals[i])),
        h("td", {}, duration(job)),
        h("td", { class: "muted" }, when(job.created_at)))));
      if (!page.data.length) body.replaceChildren(h("tr", {}, h("td", { colspan: 10, class: "muted" }, "no jobs yet")));
      more.textContent = page.has_more ? "showing the newest 100" : "";
    } catch (error) {
      more.textContent = `could not load the jobs: ${error.message}`;
    }
    if (alive) timer = setTimeout(refresh, LIST_REFRESH_MS);
  };
  await refresh();
  return () => { alive = false; clearTimeout(timer); };
}

/* "Queue by owner" (GET /v1/owners): each owner's running jobs, devices in use and queued jobs
 * beside their quotas, device-hours in the last 24 h, and the bytes it holds in the store (files,
 * models, checkpoints, outputs: the title says which) beside max_storage_bytes. Hidden where the API
 * has no such route (404: an older server). */
function ownersPanel() {
  const body = h("tbody", { id: "owners-body" });
  const note = h("p", { class: "muted", id: "owners-note" });
  const panel = h("div", { class: "card", id: "owners", hidden: true }, h("h2", {}, "Queue by owner"),
    h("table", {}, h("thead", {}, h("tr", {}, ["owner", "running jobs", "devices in use", "queued", "device-hours 24h", "stored"].map((c) => h("th", {}, c)))), body), note);
  const ofMax = (value, max) => (max === null || max === undefined ? `${value}` : `${value} / ${max}`);
  const bytes = (n) => {
    let value = Number(n || 0);
    for (const unit of ["B", "KiB", "MiB", "GiB"]) {
      if (Math.abs(value) < 1024) return unit === "B" ? `${value} B` : `${value.toFixed(1)} ${unit}`;
      value /= 1024;
    }
    return `${value.toFixed(1)} TiB`;
  };
  const stored = (o) => {
    const s = o.storage || {};
    const max = (o.quota || {}).max_storage_bytes;
    const title = `files ${bytes(s.files_bytes)}, models ${bytes(s.models_bytes)}, checkpoints ${bytes(s.checkpoints_bytes)}, outputs ${bytes(s.outputs_bytes)}`;
    return h("td", { class: "num", "data-col": "storage", title }, ofMax(bytes(s.total_bytes), max === null || max === undefined ? max : bytes(max)));
  };
  const refresh = async () => {
    let owners;
    try {
      owners = await api("v1/owners");
    } catch (error) {
      if (error.status === 404) { panel.hidden = true; return; }
      note.textContent = `could not load the owners: ${error.message}`;
      return;
    }
    panel.hidden = false;
    note.textContent = owners.data.length ? "" : "no owners yet";
    body.replaceChildren(...owners.data.map((o) => {
      const quota = o.quota || {};
      return h("tr", { "data-owner": o.name },
        h("td", {}, o.name, o.share !== undefined && o.share !== 1 ? h("span", { class: "muted" }, ` · share ${o.share}`) : null),
        h("td", { class: "num", "data-col": "running" }, o.running_jobs),
        h("td", { class: "num", "data-col": "devices" }, ofMax(o.devices_in_use, quota.max_devices)),
        h("td", { class: "num", "data-col": "queued" }, ofMax(o.queued_jobs, quota.max_queued)),
        h("td", { class: "num", "data-col": "device-hours" }, ofMax(fmt(o.device_hours_24h, 2), quota.max_device_hours_per_day)),
        stored(o));
    }));
  };
  return { panel, refresh };
}

// ------------------------------------------------------------------------------------------------
// One job, live
// ------------------------------------------------------------------------------------------------

/* The log's last lines and where in the file they end: the point the live stream goes on from. */
async function readLogTail(jobId) {
  const response = await send(`v1/jobs/${jobId}/logs?tail=${LOG_TAIL_LINES}`, { headers: { Accept: "text/plain" } });
  if (!response.ok) throw new ApiError(response.status, await response.json().catch(() => null));
  return {
    text: await response.text(),
    attempt: Number(response.headers.get("X-Gluejobs-Attempt") || 0),
    offset: Number(response.headers.get("X-Gluejobs-Log-Offset") || 0),
  };
}

const fact = (key, label, value) => h("div", { "data-fact": key }, h("span", {}, label), value);
const jobLink = (id, text, attrs = {}) => h("a", { href: `#/jobs/${id}`, ...attrs }, text);

async function jobView(view, jobId) {
  let job = await api(`v1/jobs/${jobId}`);
  // Every panel is filled from reads made after the job's own, so nothing its header shows is missing
  // from a chart (the stream alone left charts empty while it replayed a long log); the live stream
  // then goes on from exactly where these reads ended.
  const [metricRows, eventRows, logTail] = await Promise.all([
    readAll(`v1/jobs/${jobId}/metrics`), readAll(`v1/jobs/${jobId}/events`), readLogTail(jobId)]);

  const facts = h("div", { class: "facts" });
  const title = h("h1", {});
  const cancel = h("button", { id: "cancel", class: "danger", onclick: async () => {
    cancel.disabled = true;
    try { await api(`v1/jobs/${jobId}/cancel`, { method: "POST" }); await refreshJob(); }
    catch (error) { notice.textContent = error.message; }
  } }, "Cancel");
  const again = h("button", { id: "submit-again", onclick: () => openResubmit(job) }, "Submit again…");
  const notice = h("p", { class: "error", id: "job-error" });
  const streamNotice = h("p", { class: "error", id: "stream-error" });
  const charts = h("div", { class: "charts" });
  // A job that does not train has no curve: its one evaluation (step 0) as a table instead.
  const trains = jobKind(job) === "train";
  const evaluation = h("tbody", { id: "evaluation" });
  charts.hidden = !trains;
  const checkpointsBody = h("tbody", { id: "checkpoints" });
  const events = h("ul", { class: "events", id: "events" });
  const log = h("pre", { class: "log", id: "log" });
  const logTitle = h("h2", {}, "Log");
  const artifacts = h("tbody", { id: "artifacts" });
  view.append(
    h("div", { class: "toolbar" }, title, cancel, again,
      job.sweep_id ? h("a", { href: `#/sweeps/${job.sweep_id}`, id: "job-sweep" }, `one of sweep ${job.sweep_id}`) : null,
      job.search_id ? h("a", { href: `#/searches/${job.search_id}`, id: "job-search" }, `a trial of search ${job.search_id}`) : null,
      job.rerun_of ? jobLink(job.rerun_of, `rerun of job ${job.rerun_of}`, { id: "job-rerun-of" }) : null,
      h("a", { href: `#/compare?ids=${jobId}` }, "compare…")),
    h("div", { class: "card" }, facts, notice, streamNotice),
    h("h2", {}, trains ? "Curves" : "Evaluation"), charts,
    trains ? null : h("table", { id: "evaluation-table" }, h("thead", {}, h("tr", {}, ["split", "metric", "value"].map((c) => h("th", {}, c)))), evaluation),
    h("div", { class: "two" },
      h("div", {}, h("h2", {}, "Checkpoints"), h("table", {}, h("thead", {}, h("tr", {}, ["step", "epoch", "metrics", ""].map((c) => h("th", {}, c)))), checkpointsBody)),
      h("div", {}, h("h2", {}, "Artifacts"), h("table", {}, h("thead", {}, h("tr", {}, ["path", "kind", "size"].map((c) => h("th", {}, c)))), artifacts))),
    h("div", { class: "two" },
      h("div", {}, h("h2", {}, "Events"), events),
      h("div", {}, logTitle, log)),
    h("h2", {}, "Resolved spec"), h("pre", { id: "spec" }, JSON.stringify(job.spec, null, 2)));

  let total = knownSteps(job) || announcedSteps(eventRows);
  function renderHeader() {
    title.replaceChildren(`Job ${job.id} `, statusBadge(job.status));
    cancel.disabled = TERMINAL.has(job.status) || job.status === "cancelling";
    const train = (job.latest_metrics || {}).train || {};
    const metric = job.headline_metric;
    const best = job.best_metrics;
    const latest = metric ? ((job.latest_metrics || {}).eval || {})[metric.name] ?? metric.value : null;
    fill(facts,
      fact("owner", "owner", job.owner ?? "—"),
      job.status === "queued" ? fact("waiting", "waiting for", waitingText(job)) : null,
      fact("kind", "kind", KIND_TEXT[jobKind(job)]),
      fact("task", "task / files", taskOf(job)), fact("model", "model", job.spec.model_name_or_path),
      job.spec.task_name ? null : fact("files", "data files", (job.data_files || []).map((f) => h("div", {}, fileText(f)))),
      mappingText(job.spec) ? fact("mapping", "column mapping", mappingText(job.spec)) : null,
      job.pruned ? fact("pruned", "pruned", `by search ${job.pruned.search_id} at step ${job.pruned.step} (evaluation ${job.pruned.evaluation}): ${job.pruned.metric} ${fmt(job.pruned.value)}`) : null,
      fact("progress", "progress", progressCell(job, total)),
      metric ? fact(lastEval(job), `${metric.name} (${lastEval(job)} evaluation)`, fmt(latest)) : null,
      best ? fact("best", `${best.metric} (best evaluation)`, `${fmt(best.value)} · step ${best.step}`) : null,
      fact("attempts", "attempts", `${job.attempts} of ${job.max_attempts}`), fact("worker", "worker", job.worker_id || "—"),
      fact("created", "created", when(job.created_at)), fact("started", "started", when(job.started_at) || "—"),
      fact("finished", "finished", when(job.finished_at) || "—"), fact("duration", "duration", duration(job) || "—"),
      fact("seed", "seed", job.spec.seed),
      fact("train-loss", `train loss${train.step !== undefined ? ` (step ${train.step})` : ""}`, fmt(train.loss)));
    notice.textContent = job.error ? plainText(`${job.error_code ? `${job.error_code}: ` : ""}${job.error}`) : "";
    if (!trains) {
      const rows = Object.entries(job.latest_metrics || {}).filter(([split]) => split !== "train").flatMap(([split, values]) =>
        Object.entries(values).filter(([name]) => name !== "step" && name !== "epoch").map(([name, value]) =>
          h("tr", {}, h("td", {}, split), h("td", {}, name), h("td", { class: "num" }, fmt(value)))));
      evaluation.replaceChildren(...(rows.length ? rows : [h("tr", {}, h("td", { colspan: 3, class: "muted" }, jobKind(job) === "predict" ? "predictions only: see the artifacts" : "not evaluated yet"))]));
    }
  }

  const loss = new Chart(charts, "loss", "step");
  const lr = new Chart(charts, "learning_rate", "step");
  const evalCharts = new Map();
  const evalChart = (name) => {
    if (!evalCharts.has(name)) evalCharts.set(name, new Chart(charts, `eval ${name}`, "epoch"));
    return evalCharts.get(name);
  };
  let lastMetric = 0;
  let evaluated = false;
  // The train loss and the evaluations by step: a checkpoint saved between two evaluations (save_steps
  // that are not eval_steps, a drain's) has no metrics of its own, and is shown with these instead.
  const lossAt = new Map();
  const evalAt = new Map();
  const addMetric = (row) => {
    if (row.split === "train" && row.name === "loss") lossAt.set(row.step, row.value);
    else if (row.split === "eval") evalAt.set(row.step, { ...evalAt.get(row.step), [row.name]: row.value });
    if (row.split === "train" && row.name === "loss") loss.add("train", row.step, row.value);
    else if (row.split === "train" && row.name === "learning_rate") lr.add("train", row.step, row.value);
    else if (row.split !== "train") { evalChart(row.name).add(row.split, row.epoch, row.value); evaluated = true; }
    // The header's newest values come from the same rows as the charts.
    const latest = (job.latest_metrics[row.split] ||= {});
    if (row.step >= (latest.step ?? -1)) Object.assign(latest, { [row.name]: row.value, step: row.step, epoch: row.epoch });
    lastMetric = Math.max(lastMetric, row.id || 0);
  };

  let lastEvent = 0;
  const addEvent = (e) => {
    events.append(h("li", { class: e.level }, h("span", { class: "time" }, new Date(e.created_at).toLocaleTimeString()), plainText(e.message)));
    while (events.children.length > MAX_EVENTS_SHOWN) events.firstChild.remove();
    if (e.data && e.data.max_train_steps) total = e.data.max_train_steps;
  };

  const terminal = new TerminalText(LOG_LINES_SHOWN);
  let logAttempt = 0;
  const addLog = (attempt, text) => {
    if (attempt !== logAttempt) {
      if (logAttempt) terminal.note(`── attempt ${attempt} ──`);
      logAttempt = attempt;
      logTitle.textContent = `Log · attempt ${attempt}`;
    }
    terminal.write(text);
  };
  let shownLog = -1;
  const renderLog = () => {
    if (terminal.version === shownLog) return;
    shownLog = terminal.version;
    const following = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.textContent = terminal.text(); // text, never HTML
    if (following) log.scrollTop = log.scrollHeight;
  };

  // A panel's read of the job is followed by the metric rows written since the last one seen, so that
  // no figure on the page is newer than what the charts draw; `read` is that read.
  const withRows = async (read) => {
    const value = await read;
    const rows = await readAll(`v1/jobs/${jobId}/metrics`, lastMetric || null);
    return [value, rows];
  };
  const checkpointMetrics = (c) => {
    const own = Object.entries(c.metrics || {});
    if (own.length) return own.map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
    const atOrBefore = (byStep) => Math.max(-1, ...[...byStep.keys()].filter((step) => step <= c.step));
    const parts = [];
    const lossStep = atOrBefore(lossAt);
    if (lossStep >= 0) parts.push(`train loss ${fmt(lossAt.get(lossStep))}${lossStep === c.step ? "" : ` (step ${lossStep})`}`);
    const evalStep = atOrBefore(evalAt);
    if (evalStep >= 0) parts.push(`last evaluation, step ${evalStep}: ${Object.entries(evalAt.get(evalStep)).map(([k, v]) => `${k} ${fmt(v)}`).join(", ")}`);
    return h("span", { class: "muted", "data-derived": "" }, parts.join(" · ") || "not evaluated");
  };
  const refreshCheckpoints = async () => {
    const [[list, files], rows] = await withRows(Promise.all([api(`v1/jobs/${jobId}/checkpoints`), api(`v1/jobs/${jobId}/artifacts`)]));
    rows.forEach(addMetric);
    render();
    checkpointsBody.replaceChildren(...list.data.map((c) => h("tr", { "data-step": c.step, class: c.is_best ? "best" : "" },
      h("td", { class: "num" }, c.step), h("td", { class: "num" }, fmt(c.epoch, 2)),
      h("td", { class: "wrap checkpoint-metrics" }, checkpointMetrics(c)),
      h("td", {}, c.is_best ? "★ best" : ""))));
    if (!list.data.length) checkpointsBody.replaceChildren(h("tr", {}, h("td", { colspan: 4, class: "muted" }, "none yet")));
    artifacts.replaceChildren(...files.data.filter((f) => f.kind !== "checkpoint").map((f) => h("tr", {},
      h("td", {}, h("a", { href: "#", onclick: (e) => { e.preventDefault(); download(jobId, f.path); } }, f.path)),
      h("td", {}, f.kind), h("td", { class: "num" }, `${(f.size / 1024).toFixed(1)} KiB`))));
  };

  let renderTimer = null;
  let lastRender = 0;
  const refreshJob = async () => {
    const [fresh, rows] = await withRows(api(`v1/jobs/${jobId}`));
    job = fresh;
    rows.forEach(addMetric);
    render();
  };
  const render = () => {
    clearTimeout(renderTimer);
    renderTimer = null;
    lastRender = performance.now();
    loss.render(); lr.render(); evalCharts.forEach((chart) => chart.render());
    renderHeader();
    renderLog();
    events.scrollTop = events.scrollHeight;
    // An evaluation may have a new best: the job itself says (read with the rows since, at most
    // every RENDER_MS).
    if (evaluated) { evaluated = false; refreshJob().catch(() => {}); }
  };
  // At most one render every RENDER_MS, even while rows pour in faster than timers fire.
  const scheduleRender = () => {
    const since = performance.now() - lastRender;
    if (since >= RENDER_MS * 4) render();
    else if (!renderTimer) renderTimer = setTimeout(render, Math.max(0, RENDER_MS - since));
  };

  metricRows.forEach(addMetric);
  lastEvent = eventRows.length ? eventRows[eventRows.length - 1].id : 0;
  eventRows.slice(-MAX_EVENTS_SHOWN).forEach(addEvent);
  if (logTail.attempt) addLog(logTail.attempt, logTail.text);
  await refreshCheckpoints();
  render();

  const close = openStream(jobId, {
    logs: true,
    from: `${lastMetric}.${lastEvent}.${logTail.attempt}.${logTail.offset}`,
    onEvent: (kind, data) => {
      if (kind === "metric") { if (data.id > lastMetric) addMetric(data); } // else a panel's read brought it
      else if (kind === "status") { addEvent(data); refreshJob().catch(() => {}); }
      else if (kind === "checkpoint") {
        addEvent({ ...data, level: "info", message: `checkpoint at step ${data.step}${data.is_best ? " (best so far)" : ""}` });
        refreshCheckpoints().catch(() => {});
      } else if (kind === "event") {
        addEvent(data);
        if (data.kind === "checkpoint") refreshCheckpoints().catch(() => {});
      } else if (kind === "log") addLog(data.attempt, data.text);
      scheduleRender();
    },
    onEnd: (end) => {
      if (end && end.error) streamNotice.textContent = `live updates stopped: ${end.error}`;
      refreshJob().catch(() => {}); refreshCheckpoints().catch(() => {}); render();
    },
  });
  // The duration goes on between rows.
  const clock = setInterval(() => { if (!TERMINAL.has(job.status)) renderHeader(); }, CLOCK_MS);
  return () => { close(); clearTimeout(renderTimer); clearInterval(clock); loss.destroy(); lr.destroy(); evalCharts.forEach((c) => c.destroy()); };
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
// Compare: the hyperparameters that differ, metrics at the final and the best evaluation side by side,
// training loss and the eval curves overlaid
// ------------------------------------------------------------------------------------------------

/* The fields whose values are not the same in every spec (absent counts as a value), sorted. */
function specDifferences(specs) {
  const keys = [...new Set(specs.flatMap((spec) => Object.keys(spec)))].sort();
  return keys.filter((key) => new Set(specs.map((spec) => JSON.stringify(spec[key]))).size > 1);
}
const shownValue = (value) => (value === undefined ? "—" : typeof value === "string" ? value : JSON.stringify(value));

async function compareView(view, params) {
  const ids = (params.get("ids") || "").split(",").map((s) => parseInt(s, 10)).filter((n) => n > 0);
  const input = h("input", { id: "compare-ids", value: ids.join(","), placeholder: "job ids, e.g. 3,5,8", size: 30 });
  view.append(h("h1", {}, "Compare jobs"),
    h("div", { class: "toolbar" }, input, h("button", { class: "primary", onclick: () => { location.hash = `#/compare?ids=${input.value.replace(/\s/g, "")}`; } }, "Compare")));
  if (!ids.length) { view.append(h("p", { class: "muted" }, "Pick jobs on the jobs page, or type their ids.")); return () => {}; }
  const jobs = await Promise.all(ids.map((id) => api(`v1/jobs/${id}`)));
  // Read after the jobs, as on a job's page: no curve lacks what a job's figures show.
  const rows = await Promise.all(jobs.map((job) => readAll(`v1/jobs/${job.id}/metrics`)));
  const charts = h("div", { class: "charts" });
  const loss = new Chart(charts, "train loss", "step");
  const byName = new Map();
  jobs.forEach((job, i) => {
    for (const row of rows[i]) {
      if (row.split === "train") {
        if (row.name === "loss") loss.add(`job ${job.id}`, row.step, row.value);
        continue;
      }
      if (!byName.has(row.name)) byName.set(row.name, new Chart(charts, `eval ${row.name}`, "epoch"));
      byName.get(row.name).add(`job ${job.id}${row.split === "eval" ? "" : " mismatched"}`, row.epoch, row.value);
    }
  });

  const header = h("thead", {}, h("tr", {}, h("th", {}, ""), jobs.map((job) => h("th", {}, jobLink(job.id, `job ${job.id}`), " ", statusBadge(job.status)))));
  const differing = specDifferences(jobs.map((job) => job.spec));
  const same = Object.keys(jobs[0].spec).filter((key) => !differing.includes(key)).sort();
  const paramsTable = h("table", { id: "compare-params" }, header.cloneNode(true),
    h("tbody", {}, differing.map((key) => h("tr", { "data-field": key }, h("td", {}, key), jobs.map((job) => h("td", {}, shownValue(job.spec[key])))))));
  const evalOf = (job) => (job.latest_metrics || {}).eval || {};
  const names = [...new Set(jobs.flatMap((job) => [...Object.keys(evalOf(job)), ...Object.keys((job.best_metrics || {}).metrics || {})]))]
    .filter((n) => n !== "step" && n !== "epoch").sort();
  const metricRow = (name, point) => h("tr", { "data-metric": name, "data-point": point },
    h("td", {}, `${name} (${point} evaluation)`),
    jobs.map((job) => {
      if (point === "best") {
        const best = job.best_metrics;
        const value = best && best.metrics ? best.metrics[name] : undefined;
        return h("td", { class: "num" }, fmt(value), value !== undefined ? h("span", { class: "muted" }, ` · step ${best.step}`) : null);
      }
      const value = evalOf(job)[name];
      return h("td", { class: "num" }, fmt(value), value !== undefined && !TERMINAL.has(job.status) ? h("span", { class: "muted" }, " · latest so far") : null);
    }));
  add(view,
    h("h2", {}, "Hyperparameters that differ"),
    jobs.length < 2 ? h("p", { class: "muted" }, "one job: nothing to compare it with")
      : differing.length ? paramsTable : h("p", { class: "muted", id: "compare-same" }, "the specs are identical"),
    same.length ? h("details", {}, h("summary", { class: "muted" }, `${same.length} field(s) the same in every job`),
      h("p", { class: "muted" }, same.map((key) => `${key} = ${shownValue(jobs[0].spec[key])}`).join(" · "))) : null,
    h("h2", {}, "Metrics at the final and at the best evaluation"),
    h("table", { id: "compare-table" }, header,
      h("tbody", {}, names.flatMap((name) => [metricRow(name, "final"), metricRow(name, "best")]))),
    h("h2", {}, "Curves"), charts);
  loss.render();
  byName.forEach((chart) => chart.render());
  return () => { loss.destroy(); byName.forEach((chart) => chart.destroy()); };
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

/* The two evaluations a sweep's statistics are taken at (the API's `best` and `final`). */
const SWEEP_POINTS = [
  ["best", "At each job's best evaluation: median over seeds (± std · min–max)"],
  ["final", "At each job's final evaluation: median over seeds (± std · min–max)"],
];

function sweepTable(sweep, point) {
  const winner = sweep.winner ? configLabel(sweep.winner.configuration) : null;
  const configurations = sweep.configurations || [];
  const splits = [...new Set(configurations.flatMap((c) => Object.keys(c[point])))].sort();
  const columns = splits.flatMap((split) => [...new Set(configurations.flatMap((c) => Object.keys(c[point][split] || {})))].sort().map((name) => [split, name]));
  return h("table", { id: `sweep-${point}`, class: "sweep-table", "data-point": point },
    h("thead", {}, h("tr", {}, h("th", {}, "configuration"), h("th", {}, "seeds"), h("th", {}, "jobs"),
      columns.map(([split, name]) => h("th", { class: "num" }, `${split === "eval" ? "" : `${split} `}${name} (${point})${name === sweep.main_metric ? " ★" : ""}`)))),
    h("tbody", {}, configurations.map((c) => {
      const label = configLabel(c.configuration);
      return h("tr", { class: "config-row", "data-winner": label === winner },
        h("td", {}, label, label === winner ? h("span", { class: "best" }, " winner") : null),
        h("td", { class: "num" }, `${c.seeds_evaluated} / ${c.seeds.length}`),
        h("td", {}, c.job_ids.flatMap((id, i) => [jobLink(id, `#${id}`, { class: "job-link", "data-job": id, title: `seed ${c.seeds[i]}` }), " "]),
          h("a", { href: `#/compare?ids=${c.job_ids.join(",")}`, class: "muted" }, countsText(c.job_counts))),
        // The winner is ranked at the best evaluation: its cell is marked there only.
        columns.map(([split, name]) => summaryCell((c[point][split] || {})[name], point === "best" && label === winner && name === sweep.main_metric)));
    })));
}

function winnerSentence(sweep) {
  const w = sweep.winner;
  const configuration = (sweep.configurations || []).find((c) => configLabel(c.configuration) === configLabel(w.configuration));
  const final = configuration && ((configuration.final.eval || {})[w.metric] || {}).median;
  return `Winner on ${w.metric}, ranked at the best evaluation: ${configLabel(w.configuration)} — median ${fmt(w.median)} at the best evaluation`
    + `${final !== undefined && final !== null ? `, ${fmt(final)} at the final evaluation` : ""}, over ${w.seeds_evaluated} seed(s).`;
}

async function sweepView(view, sweepId) {
  const content = h("div", {});
  view.append(content);
  let timer = null;
  let alive = true;
  const render = (sweep) => {
    const cancel = h("button", { class: "danger", id: "cancel-sweep", disabled: TERMINAL.has(sweep.status), onclick: async () => {
      cancel.disabled = true;
      await api(`v1/sweeps/${sweepId}/cancel`, { method: "POST" });
      render(await api(`v1/sweeps/${sweepId}`)); // with its statistics, which the cancel's answer lacks
    } }, "Cancel sweep");
    const evaluated = (sweep.configurations || []).some((c) => c.seeds_evaluated);
    fill(content,
      h("div", { class: "toolbar" }, h("h1", {}, `Sweep ${sweep.id} `, statusBadge(sweep.status)), cancel,
        h("a", { href: `#/compare?ids=${sweep.job_ids.join(",")}` }, "compare all its jobs…")),
      h("div", { class: "card facts" },
        [["task / files", sweepTask(sweep)], ["model", sweep.spec.model_name_or_path], ["seeds", sweep.seeds.join(", ")],
         ["ranked by", `${sweep.main_metric} at the best evaluation`], ["jobs", countsText(sweep.job_counts)], ["created", when(sweep.created_at)]]
          .map(([k, v]) => h("div", {}, h("span", {}, k), v))),
      sweep.winner ? h("p", { id: "sweep-winner" }, winnerSentence(sweep)) : null,
      SWEEP_POINTS.map(([point, heading]) => [h("h2", {}, heading), sweepTable(sweep, point)]),
      evaluated ? null : h("p", { class: "muted" }, "no configuration has an evaluation yet"));
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
  const searchMatch = path.match(/^\/searches\/(\d+)$/);
  try {
    let cleanup;
    if (match) cleanup = await jobView(view, parseInt(match[1], 10));
    else if (path === "/compare") cleanup = await compareView(view, params);
    else if (sweepMatch) cleanup = await sweepView(view, parseInt(sweepMatch[1], 10));
    else if (path === "/sweeps") cleanup = await sweepsView(view);
    else if (searchMatch) cleanup = await searchView(view, parseInt(searchMatch[1], 10));
    else if (path === "/searches") cleanup = await searchesView(view);
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
