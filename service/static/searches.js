/* gluejobs dashboard: hyperparameter searches. #/searches (the list) and #/searches/<id> (the best
 * trial, the objective over trials with the pruned ones marked, each trial's evaluations, and the
 * trials table). Loaded before dashboard.js, whose helpers (h, api, fill, fmt, statusBadge, when,
 * jobLink, Chart, LIST_REFRESH_MS, TERMINAL) these views call when they run. */
"use strict";

const TRIAL_STATES = ["running", "complete", "pruned", "failed"];
const paramsText = (params) => Object.entries(params)
  .map(([k, v]) => `${k}=${typeof v === "number" ? Number(v.toPrecision(3)) : v}`).join(" ");
const objectiveText = (search) => `${search.objective.metric} (${search.objective.direction})`;

/* The space searched, one line a field: "learning_rate: 1e-05 … 0.001, log scale". */
const rangeText = (p) => (p.type === "categorical" ? `one of ${p.choices.join(", ")}`
  : `${p.low} … ${p.high}${p.type === "int" && p.step > 1 ? ` step ${p.step}` : ""}${p.log ? ", log scale" : ""}${p.type === "int" ? " (integers)" : ""}`);
const spaceList = (space) => h("ul", { class: "space", id: "search-space" },
  Object.entries(space).map(([field, p]) => h("li", { "data-field": field }, h("code", {}, field), `: ${rangeText(p)}`)));

/* What pruning saved: optimizer steps the pruned trials did not run, of what the ended trials planned. */
function savingsText(savings) {
  if (!savings || !savings.steps_planned) return "nothing to count yet: no trial has completed or been pruned with a known plan";
  const share = savings.saved_share === null ? "" : ` (${(savings.saved_share * 100).toFixed(1)} %)`;
  const unknown = savings.trials_unknown ? `; ${savings.trials_unknown} ended trial(s) left out, their plan unknown` : "";
  return `Pruning saved ${savings.steps_saved} of ${savings.steps_planned} optimizer steps${share}: `
    + `${savings.pruned_trials} trial(s) stopped early, ${savings.steps_run} steps run${unknown}.`;
}

async function searchesView(view) {
  const body = h("tbody", { id: "searches-body" });
  const note = h("p", { class: "muted" });
  view.append(h("h1", {}, "Searches"),
    h("table", { id: "searches" }, h("thead", {}, h("tr", {}, ["id", "status", "task / files", "model", "space", "objective", "trials", "best", "created"].map((c) => h("th", {}, c)))), body), note);
  let timer = null;
  let alive = true;
  const refresh = async () => {
    try {
      const page = await api("v1/searches?limit=100");
      body.replaceChildren(...page.data.map((search) => h("tr", { class: "search-row", "data-search": search.id },
        h("td", { class: "num" }, h("a", { href: `#/searches/${search.id}` }, search.id)),
        h("td", {}, statusBadge(search.status)),
        h("td", {}, search.spec.task_name || search.spec.train_file || ""),
        h("td", {}, search.spec.model_name_or_path),
        h("td", { class: "wrap" }, Object.entries(search.space).map(([k, p]) => `${k}: ${rangeText(p)}`).join("; ")),
        h("td", {}, objectiveText(search)),
        h("td", {}, `${search.n_trials}: ${countsText(search.trial_counts)}`),
        h("td", { class: "num" }, search.best ? fmt(search.best.value) : "—"),
        h("td", { class: "muted" }, when(search.created_at)))));
      if (!page.data.length) body.replaceChildren(h("tr", {}, h("td", { colspan: 9, class: "muted" }, "no searches yet (gluejobs search create …)")));
      note.textContent = page.has_more ? "showing the newest 100" : "";
    } catch (error) {
      note.textContent = `could not load the searches: ${error.message}`;
    }
    if (alive) timer = setTimeout(refresh, LIST_REFRESH_MS);
  };
  await refresh();
  return () => { alive = false; clearTimeout(timer); };
}

/* The objective over trials: each complete trial's value, each pruned trial's value where it was
 * stopped (its own series, so that it shows apart), and the best so far. */
function trialsChart(container, search) {
  const chart = new Chart(container, "objective over trials", "trial");
  const better = search.objective.direction === "maximize" ? Math.max : Math.min;
  let best = null;
  for (const trial of search.trials) {
    if (trial.state === "complete") {
      chart.add("complete", trial.number, trial.value);
      best = best === null ? trial.value : better(best, trial.value);
      chart.add("best so far", trial.number, best);
    } else if (trial.state === "pruned" && trial.pruned) {
      chart.add("pruned (value when stopped)", trial.number, trial.pruned.value);
    }
  }
  chart.render();
  return chart;
}

/* Each trial's objective at each evaluation: the pruned ones stop short. */
function evaluationsChart(container, search) {
  const chart = new Chart(container, "objective at each evaluation", "evaluation");
  for (const trial of search.trials) {
    for (const [evaluation, value] of Object.entries(trial.intermediate)) {
      chart.add(`trial ${trial.number}${trial.state === "pruned" ? " (pruned)" : ""}`, Number(evaluation), value);
    }
  }
  chart.render();
  return chart;
}

function trialsTable(search) {
  const best = search.best ? search.best.number : null;
  return h("table", { id: "trials" },
    h("thead", {}, h("tr", {}, ["trial", "job", "state", "parameters", "evaluations", "value", "pruned at"].map((c) => h("th", {}, c)))),
    h("tbody", {}, search.trials.map((t) => h("tr", { class: "trial-row", "data-trial": t.number, "data-state": t.state, "data-best": t.number === best },
      h("td", { class: "num" }, t.number, t.number === best ? h("span", { class: "best" }, " best") : null),
      h("td", { class: "num" }, t.job_id ? jobLink(t.job_id, `#${t.job_id}`, { class: "job-link", "data-job": t.job_id }) : "—"),
      h("td", {}, statusBadge(t.state)),
      h("td", {}, paramsText(t.params)),
      h("td", { class: "num" }, Object.entries(t.intermediate).sort((a, b) => a[0] - b[0]).map(([, v]) => fmt(v)).join(" · ") || "—"),
      h("td", { class: "num" }, fmt(t.value)),
      h("td", { class: "pruned-at" }, t.pruned ? `evaluation ${t.pruned.evaluation} (epoch ${t.pruned.epoch}, step ${t.pruned.step}): ${fmt(t.pruned.value)}` : "")))));
}

async function searchView(view, searchId) {
  const content = h("div", {});
  view.append(content);
  let timer = null;
  let alive = true;
  let charts = [];
  const render = (search) => {
    charts.forEach((chart) => chart.destroy());
    const cancel = h("button", { class: "danger", id: "cancel-search", disabled: TERMINAL.has(search.status), onclick: async () => {
      cancel.disabled = true;
      render(await api(`v1/searches/${searchId}/cancel`, { method: "POST" }));
    } }, "Cancel search");
    const plots = h("div", { class: "charts" });
    const best = search.best;
    fill(content,
      h("div", { class: "toolbar" }, h("h1", {}, `Search ${search.id} `, statusBadge(search.status)), cancel,
        h("a", { href: `#/compare?ids=${search.job_ids.join(",")}` }, "compare its trials…")),
      h("div", { class: "card facts" },
        [["task / files", search.spec.task_name || search.spec.train_file || ""], ["model", search.spec.model_name_or_path],
         ["objective", objectiveText(search)], ["sampler", search.sampler.type], ["pruner", search.pruner.type],
         ["trials", `${search.n_trials} (${search.parallelism} at once): ${countsText(search.trial_counts)}`], ["created", when(search.created_at)]]
          .map(([k, v]) => h("div", {}, h("span", {}, k), v))),
      h("div", { class: "two" },
        h("div", {}, h("h2", {}, "Space searched"), spaceList(search.space)),
        h("div", {}, h("h2", {}, "Compute saved by pruning"), h("p", { id: "search-savings" }, savingsText(search.savings)))),
      best ? h("p", { id: "search-best" }, `Best: trial ${best.number} (job ${best.job_id}), ${paramsText(best.params)}: ${search.objective.metric} ${fmt(best.value)}`) : null,
      search.note ? h("p", { class: "muted", id: "search-note" }, search.note) : null,
      search.seeds ? h("p", { id: "search-seeds" }, `Best configuration over seeds ${search.seeds.seeds.join(", ")} (sweep ${search.seeds.sweep_id}): median ${fmt(search.seeds.median)}`) : null,
      plots, h("h2", {}, "Trials"), trialsTable(search));
    charts = [trialsChart(plots, search), evaluationsChart(plots, search)];
    return search;
  };
  const refresh = async () => {
    let search = null;
    try { search = render(await api(`v1/searches/${searchId}`)); } catch (error) { content.replaceChildren(h("p", { class: "error" }, error.message)); }
    if (alive && !(search && TERMINAL.has(search.status))) timer = setTimeout(refresh, LIST_REFRESH_MS);
  };
  await refresh();
  return () => { alive = false; clearTimeout(timer); charts.forEach((chart) => chart.destroy()); };
}
