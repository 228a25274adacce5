"""`gluejobs search`: hyperparameter searches from the command line.

`gluejobs search create <the script's flags> --space learning_rate=float:1e-5:1e-3:log --trials 8`
starts one (more `--space`: `int:LOW:HIGH`, `choice:16,32`; `--sampler tpe|random`, `--pruner
median|asha|none`, `--metric`, `--direction`); `search ls`, `search show ID` (the best trial and the
trials table: state, parameters, the objective at each evaluation, where a pruned one stopped),
`search cancel ID` and `search seeds ID --seeds 0,1,2` (the best configuration over seeds).
"""

from __future__ import annotations

from typing import Any

import click

from gluejobs.cli.base import (
    ClientCommand,
    CliError,
    Group,
    Invocation,
    job_options,
    json_or_text,
    key_values,
    note,
    script_flags,
)
from gluejobs.cli.output import table, when
from gluejobs.cli.sweeps import parse_seeds
from gluejobs.client import Search

SEARCH_ID = click.argument("search_id", type=int, metavar="ID")
SPACE_FORMS = "FIELD=float:LOW:HIGH[:log], FIELD=int:LOW:HIGH[:log] or FIELD=choice:A,B"


@click.group("search", cls=Group)
def search() -> None:
    """Hyperparameter searches: create, ls, show, cancel, seeds.

    Trials are ordinary jobs; the service asks Optuna's sampler for each trial's values and stops
    trials whose evaluations fall behind (the pruner)."""


# The script's flags pass through to gluejobs.cli.script_args, as for `gluejobs submit` (see there).
@search.command(
    "create", cls=ClientCommand, json="the search", context_settings={"ignore_unknown_options": True}
)
@click.argument("flags", nargs=-1, type=click.UNPROCESSED, metavar="[SCRIPT FLAGS]...")
@click.option(
    "--space", multiple=True, metavar="FIELD=KIND:…", help=f"A field to search (repeatable): {SPACE_FORMS}."
)
@click.option("--trials", type=int, default=10, show_default=True, help="The trial budget.")
@click.option("--parallelism", type=int, default=2, show_default=True, help="Trials queued at once.")
@click.option("--sampler", default="tpe", show_default=True, help="tpe or random.")
@click.option("--pruner", default="median", show_default=True, help="median, asha or none.")
@click.option("--metric", help="The objective (default: the task's main metric).")
@click.option("--direction", help="maximize or minimize (default: the metric's own).")
@job_options
def create(
    api: Invocation,
    flags: tuple[str, ...],
    space: tuple[str, ...],
    trials: int,
    parallelism: int,
    sampler: str,
    pruner: str,
    metric: str | None,
    direction: str | None,
    priority: int,
    max_attempts: int,
    metadata: tuple[str, ...],
) -> None:
    """Start a search: the script's flags and --space.

    run_glue_no_trainer.py's flags give the spec, as for `gluejobs submit`; --space the fields to
    search."""
    from gluejobs.cli.script_args import script_flags_to_spec

    notes: list[str] = []
    with script_flags():
        spec = script_flags_to_spec(list(flags), notes=notes)
    for line in notes:
        note(f"note: {line}")
    ranges = parse_space(space)
    if not ranges:
        raise CliError("search create needs --space, e.g. --space learning_rate=float:1e-5:1e-3:log")
    objective = {k: v for k, v in (("metric", metric), ("direction", direction)) if v}
    with api.client() as client:
        made = client.searches.create(
            spec,
            ranges,
            objective=objective,
            n_trials=trials,
            parallelism=parallelism,
            sampler={"type": sampler},
            pruner={"type": pruner},
            priority=priority,
            max_attempts=max_attempts,
            metadata=key_values("--metadata", metadata),
        )
    ids = ", ".join(map(str, made.job_ids))
    api.show(made.raw, f"search {made.id} started: {made.n_trials} trials, first jobs {ids}")


def parse_space(items: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """--space learning_rate=float:1e-5:1e-3:log, batch=int:8:32, per_device_train_batch_size=choice:16,32."""
    space: dict[str, dict[str, Any]] = {}
    for item in items:
        name, sep, rest = item.partition("=")
        kind, _, values = rest.partition(":")
        name = name.strip().lstrip("-")
        if not sep or not name or kind not in ("float", "int", "choice") or not values:
            raise CliError(f"--space takes {SPACE_FORMS}, not {item!r}")
        if kind == "choice":
            space[name] = {
                "type": "categorical",
                "choices": [json_or_text(v.strip()) for v in values.split(",")],
            }
            continue
        parts = values.split(":")
        log = parts[-1] == "log"
        if log:
            parts = parts[:-1]
        if len(parts) != 2:
            raise CliError(f"--space {name}: give LOW:HIGH, e.g. {name}={kind}:1e-5:1e-3:log")
        number = float if kind == "float" else int
        try:
            low, high = number(parts[0]), number(parts[1])
        except ValueError:
            raise CliError(f"--space {name}: {parts[0]!r} and {parts[1]!r} must be {kind}s") from None
        space[name] = {"type": kind, "low": low, "high": high, "log": log}
    return space


COLUMNS = ("id", "status", "trials", "counts", "objective", "best", "task", "created")


@search.command("ls", cls=ClientCommand, json="the searches (a list)")
def ls(api: Invocation) -> None:
    """Searches, newest first.

    Columns: status, trials and their states, objective, best value, task, created."""
    with api.client() as client:
        found = list(client.searches.list())
    api.show([s.raw for s in found], table(COLUMNS, [_row(s) for s in found], right={"id", "trials"}))


@search.command("show", cls=ClientCommand, json="the search")
@SEARCH_ID
def show(api: Invocation, search_id: int) -> None:
    """A search: its best trial and its trials.

    Each trial: state, parameters, the objective at each evaluation, where a pruned one stopped."""
    with api.client() as client:
        found = client.searches.get(search_id)
    api.show(found.raw, search_lines(found))


@search.command("cancel", cls=ClientCommand, json="the search")
@SEARCH_ID
def cancel(api: Invocation, search_id: int) -> None:
    """Cancel a search and its running trials."""
    with api.client() as client:
        found = client.searches.cancel(search_id)
    api.show(found.raw, search_lines(found))


@search.command("seeds", cls=ClientCommand, json="the search")
@SEARCH_ID
@click.option("--seeds", required=True, help="Comma-separated seeds, e.g. 0,1,2.")
def seeds(api: Invocation, search_id: int, seeds: str) -> None:
    """Run the best configuration again over --seeds.

    A sweep of those seeds: how much of the best trial's lead holds beyond its own seed."""
    chosen = parse_seeds(seeds)
    if not chosen:
        raise CliError("search seeds takes --seeds 0,1,2")
    with api.client() as client:
        found = client.searches.rerun_best(search_id, chosen)
    api.show(found.raw, search_lines(found))


def _row(found: Search) -> list[str]:
    best = found.best
    return [
        str(found.id),
        found.status,
        str(found.n_trials),
        _counts(found),
        f"{found.objective.get('metric')} ({found.objective.get('direction')})",
        f"{best['value']:.4f} (trial {best['number']})" if best else "-",
        str(found.spec.get("task_name") or found.spec.get("train_file") or ""),
        when(found.created_at),
    ]


def _counts(found: Search) -> str:
    return ", ".join(f"{n} {state}" for state, n in found.trial_counts.items() if n)


def search_lines(found: Search) -> list[str]:
    """`gluejobs search show`: the search, its best trial, and one line per trial."""
    metric = found.objective.get("metric")
    lines = [
        f"search {found.id}: {found.status} ({_counts(found)}); {found.n_trials} trials, "
        f"{metric} ({found.objective.get('direction')}), sampler {found.sampler.get('type')}, "
        f"pruner {found.pruner.get('type')}"
    ]
    if found.note:
        lines.append(f"  note: {found.note}")
    if found.best:
        params = " ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in found.best["params"].items()
        )
        lines.append(
            f"  best: trial {found.best['number']} (job {found.best['job_id']}): {params}: "
            f"{metric} {found.best['value']:.4f}"
        )
    rows = []
    for trial in found.trials or []:
        params = " ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial["params"].items()
        )
        values = " ".join(
            f"{v:.4f}" for _, v in sorted(trial["intermediate"].items(), key=lambda kv: int(kv[0]))
        )
        pruned = trial["pruned"]
        where = f"evaluation {pruned['evaluation']} (epoch {pruned['epoch']:g})" if pruned else ""
        value = f"{trial['value']:.4f}" if trial["value"] is not None else "-"
        rows.append(
            [str(trial["number"]), str(trial["job_id"]), trial["state"], params, values or "-", value, where]
        )
    if rows:
        columns = ("trial", "job", "state", "params", "evaluations", "value", "pruned at")
        lines += ["  " + line for line in table(columns, rows, right={"trial", "job"})]
    if found.seeds:
        median = found.seeds.get("median")
        lines.append(
            f"  seeds {found.seeds['seeds']} (sweep {found.seeds['sweep_id']}, {found.seeds['status']}): "
            + (f"median {metric} {median:.4f}" if median is not None else "no seed finished yet")
        )
    return lines


COMMANDS = (search,)
