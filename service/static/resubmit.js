/* "Submit again": the job's spec as it would be submitted, in a form to edit. The API checks it with a
 * dry run (POST /v1/jobs?dry_run=true: its plan, or its 422 shown in the form, at the field it
 * names); nothing is queued until the user has seen the changes and confirmed them. Uses api, h, fill,
 * specDifferences and shownValue from dashboard.js. */
"use strict";

function openResubmit(job) {
  const textarea = h("textarea", { id: "resubmit-spec", rows: 18, spellcheck: "false", "aria-label": "spec (JSON)" });
  textarea.value = JSON.stringify(job.spec, null, 2);
  const priority = h("input", { id: "resubmit-priority", type: "number", value: job.priority });
  const attempts = h("input", { id: "resubmit-attempts", type: "number", min: 1, value: job.max_attempts });
  const error = h("p", { class: "error", id: "resubmit-error" });
  const plan = h("div", { id: "resubmit-plan", class: "muted" });
  const changes = h("ul", { id: "resubmit-changes" });
  const yes = h("button", { id: "resubmit-yes", class: "primary" }, "Queue it");
  const back = h("button", { id: "resubmit-back" }, "Back to editing");
  const confirm = h("div", { id: "resubmit-confirm", class: "card" },
    h("p", {}, "Queue a new job with this spec?"), changes, h("div", { class: "toolbar" }, yes, back));
  const check = h("button", { id: "resubmit-check" }, "Check");
  const next = h("button", { id: "resubmit-next", class: "primary" }, "Queue…");
  const close = h("button", { id: "resubmit-close" }, "Cancel");
  const actions = h("div", { class: "toolbar" }, check, next, close);
  const dialog = h("dialog", { id: "resubmit", class: "wide" },
    h("h2", {}, `Submit job ${job.id} again`),
    h("p", { class: "muted" }, "The spec as it will be submitted (the resolved spec, seed included). Edit it as JSON; the API checks it before anything is queued."),
    textarea, h("div", { class: "toolbar" }, h("label", {}, "priority ", priority), h("label", {}, "max attempts ", attempts)),
    error, plan, confirm, actions);
  confirm.hidden = true;
  document.body.append(dialog);
  dialog.addEventListener("close", () => dialog.remove());
  close.onclick = () => dialog.close();

  // A sweep's labels stay with the sweep's own jobs (as on rerun); the new job says where it came from.
  const metadata = Object.fromEntries(Object.entries(job.metadata || {}).filter(([k]) => !k.startsWith("sweep_")));
  metadata.resubmitted_from = String(job.id);
  const body = () => {
    let spec;
    try { spec = JSON.parse(textarea.value); } catch (e) { throw new Error(`the spec is not valid JSON: ${e.message}`); }
    if (!spec || typeof spec !== "object" || Array.isArray(spec)) throw new Error("the spec must be a JSON object of fields and values");
    const number = (input) => (input.value.trim() === "" ? undefined : Number(input.value));
    return { spec, priority: number(priority), max_attempts: number(attempts), metadata };
  };
  const showError = (e) => {
    error.textContent = e.field ? `${e.field}: ${e.message}` : e.message;
    // Point at what the API named: the spec's key in the text, or the input.
    const key = (e.field || "").replace(/^spec\./, "").split(".")[0];
    if (e.field === "priority") priority.focus();
    else if (e.field === "max_attempts") attempts.focus();
    else if (key && e.field.startsWith("spec.")) {
      const at = textarea.value.indexOf(`"${key}"`);
      if (at >= 0) { textarea.focus(); textarea.setSelectionRange(at, at + key.length + 2); }
    }
  };
  // The dry run of what the form holds now: its plan, or null with the reason shown.
  const dryRun = async () => {
    error.textContent = "";
    plan.replaceChildren();
    try {
      const checked = await api("v1/jobs?dry_run=true", {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body()),
      });
      const schedule = checked.schedule || {};
      fill(plan,
        h("p", { id: "resubmit-ok" }, "The API accepts it: ", schedule.status === "known"
          ? `${schedule.total_optimizer_steps} optimizer steps over ${schedule.epochs} epoch(s), ${schedule.evaluations} evaluation(s).`
          : `${schedule.reason || "its schedule depends on data the API does not read"}.`),
        (checked.warnings || []).length ? h("ul", { class: "warnings" }, checked.warnings.map((w) => h("li", {}, w))) : null);
      return checked;
    } catch (e) {
      showError(e);
      return null;
    }
  };
  const editing = (on) => {
    textarea.readOnly = priority.readOnly = attempts.readOnly = !on;
    confirm.hidden = on;
    actions.hidden = !on;
  };
  check.onclick = () => { dryRun(); };
  next.onclick = async () => {
    next.disabled = true;
    const checked = await dryRun();
    next.disabled = false;
    if (!checked) return;
    const wanted = body();
    const differences = specDifferences([job.spec, wanted.spec]);
    changes.replaceChildren(...(differences.length
      ? differences.map((k) => h("li", { "data-field": k }, `${k}: ${shownValue(job.spec[k])} → ${shownValue(wanted.spec[k])}`))
      : [h("li", {}, `no change: job ${job.id}'s spec again, seed ${job.spec.seed}`)]));
    // One key per confirmation: a double click queues one job. (getRandomValues, not randomUUID: the
    // latter exists only on https and localhost pages, and a team may serve this over plain http.)
    yes.dataset.key = [...crypto.getRandomValues(new Uint8Array(16))].map((b) => b.toString(16).padStart(2, "0")).join("");
    editing(false);
    yes.focus();
  };
  back.onclick = () => editing(true);
  yes.onclick = async () => {
    yes.disabled = true;
    try {
      const created = await api("v1/jobs", {
        method: "POST", headers: { "Content-Type": "application/json", "Idempotency-Key": yes.dataset.key },
        body: JSON.stringify(body()),
      });
      dialog.close();
      location.hash = `#/jobs/${created.id}`;
    } catch (e) {
      editing(true);
      showError(e);
    } finally {
      yes.disabled = false;
    }
  };
  dialog.showModal();
  dryRun();
}
