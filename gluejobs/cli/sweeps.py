"""The research commands: `sweep` (create, ls, show, cancel), `leaderboard` and `glue-zip`.

`gluejobs sweep <the script's flags> --seeds 0,1,2,3,4 --grid learning_rate=1e-4,5e-4` submits one
job per combination (`--dry-run`: checks them all, stores nothing); `gluejobs sweep ls`, `sweep show
ID` (statistics over seeds per configuration, best and final evaluation) and `sweep cancel ID`;
`gluejobs leaderboard [--task rte]`; `gluejobs glue-zip 12 13 14 -o submission.zip` downloads GLUE's
zip of those jobs' prediction files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gluejobs.cli.base import (
    ClientCommand,
    CliError,
    DefaultGroup,
    Invocation,
    job_options,
    json_or_text,
    key_values,
    note,
    script_flags,
)
from gluejobs.cli.files import upload_local_files
from gluejobs.cli.output import aligned, print_warnings, table, when
from gluejobs.client import Sweep

SWEEP_ID = click.argument("sweep_id", type=int, metavar="ID")


@click.group("sweep", cls=DefaultGroup, default="create")
def sweep() -> None:
    """Sweeps: one job per combination of --grid and --seeds.

    `gluejobs sweep <the script's flags> --seeds … --grid …` is short for `sweep create …`; `sweep
    ls`, `sweep show ID`, `sweep cancel ID`."""


# The script's flags pass through to gluejobs.cli.script_args, as for `gluejobs submit` (see there).
@sweep.command(
    "create",
    cls=ClientCommand,
    json="the sweep (with --dry-run: the plan)",
    context_settings={"ignore_unknown_options": True},
)
@click.argument("flags", nargs=-1, type=click.UNPROCESSED, metavar="[SCRIPT FLAGS]...")
@click.option("--seeds", default="", help="Comma-separated seeds, e.g. 0,1,2,3,4.")
@click.option(
    "--grid", multiple=True, metavar="FIELD=V1,V2", help="A spec field and its values (repeatable)."
)
@click.option("--dry-run", is_flag=True, help="Check every combination; queue nothing.")
@job_options
def create(
    api: Invocation,
    flags: tuple[str, ...],
    seeds: str,
    grid: tuple[str, ...],
    dry_run: bool,
    priority: int,
    max_attempts: int,
    metadata: tuple[str, ...],
) -> None:
    """Submit a sweep: the script's flags, --seeds and --grid.

    run_glue_no_trainer.py's flags give the spec, as for `gluejobs submit`; one job is queued per
    combination of --grid values and --seeds."""
    from gluejobs.cli.script_args import script_flags_to_spec

    notes: list[str] = []
    with script_flags():
        spec = script_flags_to_spec(list(flags), notes=notes)
    for line in notes:
        note(f"note: {line}")
    options: dict[str, Any] = {
        "seeds": parse_seeds(seeds),
        "grid": parse_grid(grid),
        "priority": priority,
        "max_attempts": max_attempts,
        "metadata": key_values("--metadata", metadata),
    }
    with api.client() as client:
        spec, complete = upload_local_files(client, spec, dry_run=dry_run)  # files on this machine
        if not complete:
            note("note: no plan: the API has not got every local file yet (the sweep uploads them)")
            return
        if dry_run:
            plan = client.sweeps.dry_run(spec, **options)
            api.show(plan.raw, f"sweep plan: {len(plan.jobs)} jobs, seeds {plan.seeds}; nothing was stored")
            for job in [] if api.json else plan.jobs:
                print(f"  {job['configuration']}")
                print_warnings(job["warnings"], indent="    ")
            return
        made = client.sweeps.create(spec, **options)
    ids = ", ".join(map(str, made.job_ids))
    api.show(made.raw, f"sweep {made.id} queued: {len(made.job_ids)} jobs ({ids}), seeds {made.seeds}")
    print_warnings(made.warnings)


def parse_seeds(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise CliError(f"--seeds takes comma-separated whole numbers, not {text!r}") from None


def parse_grid(items: tuple[str, ...]) -> dict[str, list[Any]]:
    """--grid learning_rate=1e-4,5e-4: values read as JSON where they are (numbers, true/false)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise CliError(f"--grid takes FIELD=V1,V2, not {item!r}")
        grid[name.strip().lstrip("-")] = [json_or_text(v.strip()) for v in values.split(",") if v.strip()]
    return grid


SWEEP_COLUMNS = ("id", "status", "jobs", "counts", "task", "model", "grid", "created")


@sweep.command("ls", cls=ClientCommand, json="the sweeps (a list)")
def ls(api: Invocation) -> None:
    """Sweeps, newest first.

    Columns: status, jobs and their states, task, model, the grid's fields, created."""
    with api.client() as client:
        found = list(client.sweeps.list())
    api.show(
        [s.raw for s in found], table(SWEEP_COLUMNS, [_sweep_row(s) for s in found], right={"id", "jobs"})
    )


@sweep.command("show", cls=ClientCommand, json="the sweep")
@SWEEP_ID
def show(api: Invocation, sweep_id: int) -> None:
    """A sweep's statistics over seeds, and the winner.

    Per configuration, the median ± std [min–max] over seeds at the best and at the final
    evaluation."""
    with api.client() as client:
        found = client.sweeps.get(sweep_id)
    api.show(found.raw, sweep_lines(found))


@sweep.command("cancel", cls=ClientCommand, json="the sweep")
@SWEEP_ID
def cancel(api: Invocation, sweep_id: int) -> None:
    """Cancel what is left of a sweep (its queued and running jobs)."""
    with api.client() as client:
        found = client.sweeps.cancel(sweep_id)
    api.show(found.raw, f"sweep {found.id}: {found.status} ({_counts(found)})")


def _sweep_row(found: Sweep) -> list[str]:
    return [
        str(found.id),
        found.status,
        str(len(found.job_ids)),
        _counts(found),
        str(found.spec.get("task_name") or found.spec.get("train_file") or found.grid.get("task_name") or ""),
        str(found.spec.get("model_name_or_path") or ""),
        ", ".join(found.grid) or "-",
        when(found.created_at),
    ]


def _counts(found: Sweep) -> str:
    return ", ".join(f"{n} {status}" for status, n in found.job_counts.items() if n)


def sweep_lines(found: Sweep) -> list[str]:
    """`gluejobs sweep show`: each configuration's median ± std [min–max] over seeds of the main
    metric, at the best evaluation and at the final one (said which is which), and the winner."""
    metric = found.main_metric
    lines = [f"sweep {found.id}: {found.status} ({_counts(found)}); seeds {found.seeds}, ranked by {metric}"]
    for configuration in found.configurations or []:
        name = " ".join(f"{k}={v}" for k, v in configuration["configuration"].items()) or "(the spec)"
        evaluated = configuration["seeds_evaluated"]
        stats = [
            (f"{point} evaluation", _stat(configuration[point].get("eval", {}).get(metric)))
            for point in ("best", "final")
        ]
        lines.append(
            f"  {name}: jobs {', '.join(map(str, configuration['job_ids']))}, {evaluated} seeds evaluated"
        )
        lines += aligned(stats, indent="    ")
    winner = found.winner
    if winner:
        name = " ".join(f"{k}={v}" for k, v in winner["configuration"].items()) or "(the spec)"
        std = f" ± {winner['std']:.4f}" if winner.get("std") is not None else ""
        lines.append(f"  winner (best evaluation, median): {name}: {metric} {winner['median']:.4f}{std}")
    lines += [f"  warning: {warning}" for warning in found.warnings]
    return lines


def _stat(summary: dict[str, Any] | None) -> str:
    if not summary:
        return "-"
    std = f" ± {summary['std']:.4f}" if summary.get("std") is not None else ""
    return (
        f"median {summary['median']:.4f}{std} [{summary['min']:.4f}–{summary['max']:.4f}], n {summary['n']}"
    )


LEADERBOARD_COLUMNS = (
    "rank",
    "kind",
    "id",
    "best",
    "final",
    "std",
    "seeds",
    "model",
    "recipe",
    "trainable",
    "",
)
LEADERBOARD_RIGHT = {"rank", "id", "best", "final", "std", "seeds", "trainable"}


@click.command("leaderboard", cls=ClientCommand, json="the boards (a list)")
@click.option("--task", help="One GLUE task (rte, sst2 …); every task by default.")
def leaderboard(api: Invocation, task: str | None) -> None:
    """Succeeded jobs and sweeps, ranked per task.

    Beside the majority-class baseline; an entry near it is marked."""
    with api.client() as client:
        boards = client.leaderboard(task=task)
    lines: list[str] = []
    for board in boards:
        baseline = board.baseline
        chance = f"; majority-class baseline {baseline['value']:.4f}" if baseline else ""
        lines.append(f"{board.task} ({board.metric}{chance})")
        rows = [
            [
                str(entry["rank"]),
                entry["kind"],
                str(entry["id"]),
                f"{entry['value']:.4f}",
                _four(entry.get("final_value")),
                _four(entry.get("std")),
                str(entry["seeds"]),
                entry["model"],
                entry["recipe"],
                "-" if entry.get("trainable_params") is None else f"{entry['trainable_params']:,}",
                "near chance" if entry.get("near_chance") else "",
            ]
            for entry in board.entries
        ]
        lines += table(LEADERBOARD_COLUMNS, rows, right=LEADERBOARD_RIGHT)
    api.show([board.raw for board in boards], lines)


def _four(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


@click.command("glue-zip", cls=ClientCommand)
@click.argument("job_ids", nargs=-1, required=True, type=int, metavar="JOB...")
@click.option(
    "-o",
    "--output",
    default="submission.zip",
    show_default=True,
    type=click.Path(),
    help="Where to write the zip.",
)
@click.option("--allow-partial", is_flag=True, help="Bundle even when tasks are missing.")
def glue_zip(api: Invocation, job_ids: tuple[int, ...], output: str, allow_partial: bool) -> None:
    """Download GLUE's submission zip of do_predict jobs.

    One prediction file per task, in GLUE's format."""
    params: dict[str, Any] = {"jobs": ",".join(map(str, job_ids))}
    if allow_partial:
        params["allow_partial"] = "true"
    with api.client() as client:
        content = client.fetch("/v1/submissions", params=params)
    Path(output).write_bytes(content)
    print(f"wrote {output} ({len(content)} bytes) from jobs {', '.join(map(str, job_ids))}")


COMMANDS = (sweep, leaderboard, glue_zip)
