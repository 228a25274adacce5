"""The research commands of `gluejobs`: `sweep`, `leaderboard`, `rerun`, `glue-zip`, and the plan
`submit --dry-run` prints.

`gluejobs sweep <the script's flags> --seeds 0,1,2,3,4 --grid learning_rate=1e-4,5e-4` submits one
job per combination (`--dry-run`: checks them all, stores nothing); `gluejobs sweep ls`, `sweep show
ID` (statistics over seeds per configuration, best and final evaluation) and `sweep cancel ID`;
`gluejobs leaderboard [--task rte]`; `gluejobs rerun JOB [--watch]` queues the same spec again and,
once both have finished, says whether it reproduced; `gluejobs glue-zip 12 13 14 -o submission.zip`
downloads GLUE's zip of those jobs' prediction files.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gluejobs import job_view
from gluejobs.client import Client, Sweep
from gluejobs.files_cli import upload_local_files
from gluejobs.output import aligned, print_json, print_warnings, table

# gluejobs.cli's way of adding a command with --url and --api-key.
AddClientCommand = Callable[..., argparse.ArgumentParser]


def add_commands(commands: Any, client_command: AddClientCommand) -> None:
    sweep = client_command(
        commands,
        "sweep",
        help="submit a sweep (the script's flags plus --seeds and --grid), or `sweep ls|show ID|cancel ID`",
        allow_abbrev=False,
        description="One job per combination of --grid values and --seeds; the other flags are "
        "run_glue_no_trainer.py's, as for `gluejobs submit`. `gluejobs sweep ls` lists sweeps, "
        "`sweep show ID` gives per configuration the statistics over seeds, `sweep cancel ID` cancels "
        "what is left.",
    )
    sweep.add_argument("--seeds", default="", help="comma-separated seeds, e.g. 0,1,2,3,4")
    sweep.add_argument(
        "--grid", action="append", default=[], metavar="FIELD=V1,V2", help="a spec field and its values"
    )
    sweep.add_argument("--priority", type=int, default=0)
    sweep.add_argument("--max-attempts", type=int, default=3)
    sweep.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    sweep.add_argument("--dry-run", action="store_true", help="check every combination; queue nothing")
    sweep.add_argument("--json", action="store_true", help="the API's answer: one JSON document")

    leaderboard = client_command(
        commands, "leaderboard", help="succeeded jobs and sweeps ranked per task, beside the baseline"
    )
    leaderboard.add_argument("--task", help="one GLUE task (rte, sst2 …); every task by default")
    leaderboard.add_argument("--json", action="store_true", help="the boards: one JSON document")

    rerun = client_command(
        commands, "rerun", help="queue a job's exact spec again (same seed) and say whether it reproduced"
    )
    rerun.add_argument("job_id", type=int)
    rerun.add_argument(
        "--watch", action="store_true", help="follow the rerun, then compare it with the original"
    )
    rerun.add_argument("--json", action="store_true", help="the new job: one JSON document")

    glue_zip = client_command(
        commands, "glue-zip", help="download GLUE's submission zip of jobs run with do_predict"
    )
    glue_zip.add_argument("job_ids", type=int, nargs="+", metavar="JOB")
    glue_zip.add_argument("-o", "--output", default="submission.zip", help="where to write the zip")
    glue_zip.add_argument("--allow-partial", action="store_true", help="bundle even when tasks are missing")


def parse_seeds(text: str) -> list[int]:
    from gluejobs.script_args import ScriptArgsError

    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ScriptArgsError(f"--seeds takes comma-separated whole numbers, not {text!r}") from None


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """--grid learning_rate=1e-4,5e-4: values read as JSON where they are (numbers, true/false)."""
    from gluejobs.script_args import ScriptArgsError

    grid: dict[str, list[Any]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise ScriptArgsError(f"--grid takes FIELD=V1,V2, not {item!r}")
        grid[name.strip().lstrip("-")] = [_value(v.strip()) for v in values.split(",") if v.strip()]
    return grid


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


SWEEP_COMMANDS = ("ls", "show", "cancel")


def run_sweep(args: argparse.Namespace, extra: list[str], client: Client) -> int:
    if extra and extra[0] in SWEEP_COMMANDS:
        return _sweep_command(args, extra, client)
    # The flag translation reads the job spec's fields (pydantic): loaded only by this command.
    from gluejobs.script_args import script_flags_to_spec

    notes: list[str] = []
    spec = script_flags_to_spec(extra, notes=notes)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    options: dict[str, Any] = {
        "seeds": parse_seeds(args.seeds),
        "grid": parse_grid(args.grid),
        "priority": args.priority,
        "max_attempts": args.max_attempts,
        "metadata": dict(item.split("=", 1) for item in args.metadata if "=" in item),
    }
    spec, complete = upload_local_files(client, spec, dry_run=args.dry_run)  # files on this machine
    if not complete:
        print(
            "note: no plan: the API has not got every local file yet (the sweep uploads them)",
            file=sys.stderr,
        )
        return 0
    if args.dry_run:
        plan = client.sweeps.dry_run(spec, **options)
    else:
        sweep = client.sweeps.create(spec, **options)
    if args.dry_run:
        if args.json:
            print_json(plan.raw)
            return 0
        print(f"sweep plan: {len(plan.jobs)} jobs, seeds {plan.seeds}; nothing was stored")
        for job in plan.jobs:
            print(f"  {job['configuration']}")
            print_warnings(job["warnings"], indent="    ")
        return 0
    if args.json:
        print_json(sweep.raw)
    else:
        ids = ", ".join(map(str, sweep.job_ids))
        print(f"sweep {sweep.id} queued: {len(sweep.job_ids)} jobs ({ids}), seeds {sweep.seeds}")
    print_warnings(sweep.warnings)
    return 0


def _sweep_command(args: argparse.Namespace, extra: list[str], client: Client) -> int:
    from gluejobs.script_args import ScriptArgsError

    command, operands = extra[0], extra[1:]
    if command == "ls":
        if operands:
            raise ScriptArgsError(f"sweep ls takes no operands, not {' '.join(operands)!r}")
        sweeps = list(client.sweeps.list())
        if args.json:
            print_json([sweep.raw for sweep in sweeps])
        else:
            print("\n".join(table(SWEEP_COLUMNS, [_sweep_row(s) for s in sweeps], right={"id", "jobs"})))
        return 0
    if len(operands) != 1 or not operands[0].isdigit():
        raise ScriptArgsError(f"sweep {command} takes one sweep id (gluejobs sweep {command} ID)")
    sweep_id = int(operands[0])
    sweep = client.sweeps.get(sweep_id) if command == "show" else client.sweeps.cancel(sweep_id)
    if args.json:
        print_json(sweep.raw)
    elif command == "show":
        print("\n".join(sweep_lines(sweep)))
    else:
        print(f"sweep {sweep.id}: {sweep.status} ({_counts(sweep)})")
    return 0


SWEEP_COLUMNS = ("id", "status", "jobs", "counts", "task", "model", "grid", "created")


def _sweep_row(sweep: Sweep) -> list[str]:
    return [
        str(sweep.id),
        sweep.status,
        str(len(sweep.job_ids)),
        _counts(sweep),
        str(sweep.spec.get("task_name") or sweep.spec.get("train_file") or sweep.grid.get("task_name") or ""),
        str(sweep.spec.get("model_name_or_path") or ""),
        ", ".join(sweep.grid) or "-",
        job_view.when(sweep.created_at),
    ]


def _counts(sweep: Sweep) -> str:
    return ", ".join(f"{n} {status}" for status, n in sweep.job_counts.items() if n)


def sweep_lines(sweep: Sweep) -> list[str]:
    """`gluejobs sweep show`: each configuration's median ± std [min–max] over seeds of the main
    metric, at the best evaluation and at the final one (said which is which), and the winner."""
    metric = sweep.main_metric
    lines = [f"sweep {sweep.id}: {sweep.status} ({_counts(sweep)}); seeds {sweep.seeds}, ranked by {metric}"]
    for configuration in sweep.configurations or []:
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
    winner = sweep.winner
    if winner:
        name = " ".join(f"{k}={v}" for k, v in winner["configuration"].items()) or "(the spec)"
        std = f" ± {winner['std']:.4f}" if winner.get("std") is not None else ""
        lines.append(f"  winner (best evaluation, median): {name}: {metric} {winner['median']:.4f}{std}")
    lines += [f"  warning: {warning}" for warning in sweep.warnings]
    return lines


def _stat(summary: dict[str, Any] | None) -> str:
    if not summary:
        return "-"
    std = f" ± {summary['std']:.4f}" if summary.get("std") is not None else ""
    return (
        f"median {summary['median']:.4f}{std} [{summary['min']:.4f}–{summary['max']:.4f}], n {summary['n']}"
    )


def run_leaderboard(args: argparse.Namespace, _extra: list[str], client: Client) -> int:
    boards = client.leaderboard(task=args.task)
    if args.json:
        print_json([board.raw for board in boards])
        return 0
    columns = ("rank", "kind", "id", "best", "final", "std", "seeds", "model", "recipe", "trainable", "")
    for board in boards:
        baseline = board.baseline
        chance = f"; majority-class baseline {baseline['value']:.4f}" if baseline else ""
        print(f"{board.task} ({board.metric}{chance})")
        rows = [
            [
                str(entry["rank"]),
                entry["kind"],
                str(entry["id"]),
                f"{entry['value']:.4f}",
                "-" if entry.get("final_value") is None else f"{entry['final_value']:.4f}",
                "-" if entry.get("std") is None else f"{entry['std']:.4f}",
                str(entry["seeds"]),
                entry["model"],
                entry["recipe"],
                "-" if entry.get("trainable_params") is None else f"{entry['trainable_params']:,}",
                "near chance" if entry.get("near_chance") else "",
            ]
            for entry in board.entries
        ]
        print(
            "\n".join(
                table(columns, rows, right={"rank", "id", "best", "final", "std", "seeds", "trainable"})
            )
        )
    return 0


def run_rerun(args: argparse.Namespace, _extra: list[str], client: Client) -> int:
    job = client.jobs.rerun(args.job_id)
    what = f"queued (a rerun of job {args.job_id})"
    code = job_view.created(client, job, json_output=args.json, watch=args.watch, what=what)
    if args.watch:
        print("\n".join(job_view.reproduction_lines(client.jobs.get(job.id).reproduction)))
    elif not args.json:
        print(
            f"once both have finished, `gluejobs show {job.id}` says whether it reproduced job {args.job_id}"
        )
    return code


def run_glue_zip(args: argparse.Namespace, _extra: list[str], client: Client) -> int:
    params: dict[str, Any] = {"jobs": ",".join(map(str, args.job_ids))}
    if args.allow_partial:
        params["allow_partial"] = "true"
    content = client.fetch("/v1/submissions", params=params)
    Path(args.output).write_bytes(content)
    print(f"wrote {args.output} ({len(content)} bytes) from jobs {', '.join(map(str, args.job_ids))}")
    return 0


# ---------------------------------------------------------------------------------------------------
# The dry-run plan, for people
# ---------------------------------------------------------------------------------------------------


def plan_lines(plan: dict[str, Any]) -> list[str]:
    spec = plan["spec"]
    source = spec.get("task_name") or spec.get("train_file")
    lines = [f"plan for {source} on {spec['model_name_or_path']} (seed {spec['seed']}); nothing was stored"]
    lines += [f"  warning: {w}" for w in plan["warnings"]]  # at the top, where they are read
    for name, split in plan["data"]["splits"].items():
        labels = split.get("label_counts") or split.get("score_range") or {}
        shown = ", ".join(f"{k} {v}" for k, v in labels.items())
        lines.append(
            f"  data {name:<15} {split['where']}: {split['rows']} rows, {split['rows_used']} used"
            + (f"; {shown}" if shown else "")
        )
    for name, split in plan["data"]["predict"].items():
        lines.append(f"  predict {name:<12} {split['where']}: {split['rows']} rows")
    for item in plan["data"]["unread"]:
        lines.append(f"  not read here     {item} (the worker reads it)")
    lines.append("  " + _schedule_line(plan["schedule"], spec))
    lines.append("  " + _tokens_line(plan["tokens"]))
    lines.append("  " + _memory_line(plan["memory"]))
    return lines


def _schedule_line(schedule: dict[str, Any], spec: dict[str, Any]) -> str:
    if schedule["status"] != "known":
        return f"schedule: unknown ({schedule['reason']})"
    steps = ", ".join(map(str, schedule["evaluation_steps"]))
    # The epochs asked for (2.5), unless max_train_steps decides: then the epochs the steps span.
    epochs = (
        schedule["epochs"]
        if spec.get("max_train_steps")
        else spec.get("num_train_epochs", schedule["epochs"])
    )
    return (
        f"schedule: {schedule['steps_per_epoch']} steps/epoch × {epochs} epochs = "
        f"{schedule['total_optimizer_steps']} optimizer steps ({schedule['samples_per_optimizer_step']} "
        f"samples each), warmup {schedule['warmup_steps']}, {schedule['evaluations']} evaluations"
        + (f" at steps {steps}" if steps else "")
        + f", {schedule['checkpoints']} checkpoints"
    )


def _tokens_line(tokens: dict[str, Any]) -> str:
    if tokens["status"] != "measured":
        return f"tokens: unknown ({tokens['reason']})"
    train = tokens["train"]
    padding = train["padding"]
    schemes = ", ".join(
        f"{name} {padding[name]['padding_percent']}%"
        for name in ("dynamic", "group_by_length", "pad_to_max_length")
    )
    return (
        f"tokens: train longest {train['longest']}, mean {train['mean']} ({train['sample']}, "
        f"{train['truncated_rows']} truncated); padding {schemes} (this job: {padding['used']})"
    )


def _memory_line(memory: dict[str, Any]) -> str:
    if memory["status"] != "estimated":
        return f"memory: unknown ({memory['reason']})"
    return (
        f"memory: ~{memory['total_gib']} GiB per process ({memory['precision']}, batch {memory['batch']} × "
        f"{memory['sequence_length']} tokens, {memory['trainable_parameters']:,} trainable of "
        f"{memory['parameters']:,} parameters)"
    )
