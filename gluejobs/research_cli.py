"""The research commands of `gluejobs`: `sweep`, `glue-zip`, and the plan `submit --dry-run` prints.

`gluejobs sweep <the script's flags> --seeds 0,1,2,3,4 --grid learning_rate=1e-4,5e-4` submits one
job per combination; `gluejobs glue-zip 12 13 14 -o submission.zip` downloads GLUE's zip of those
jobs' prediction files.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gluejobs.client import Client

# gluejobs.cli's way of adding a command with --url and --api-key.
AddClientCommand = Callable[..., argparse.ArgumentParser]


def add_commands(commands: Any, client_command: AddClientCommand) -> None:
    sweep = client_command(
        commands,
        "sweep",
        help="submit a sweep: the script's flags plus --seeds and --grid",
        allow_abbrev=False,
        description="One job per combination of --grid values and --seeds; the other flags are "
        "run_glue_no_trainer.py's, as for `gluejobs submit`.",
    )
    sweep.add_argument("--seeds", default="", help="comma-separated seeds, e.g. 0,1,2,3,4")
    sweep.add_argument(
        "--grid", action="append", default=[], metavar="FIELD=V1,V2", help="a spec field and its values"
    )
    sweep.add_argument("--priority", type=int, default=0)
    sweep.add_argument("--max-attempts", type=int, default=3)
    sweep.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")

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


def run_sweep(args: argparse.Namespace, extra: list[str], client: Client) -> int:
    # The flag translation reads the job spec's fields (pydantic): loaded only by this command.
    from gluejobs.script_args import script_flags_to_spec

    notes: list[str] = []
    spec = script_flags_to_spec(extra, notes=notes)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    body = {
        "spec": spec,
        "seeds": parse_seeds(args.seeds),
        "grid": parse_grid(args.grid),
        "priority": args.priority,
        "max_attempts": args.max_attempts,
        "metadata": dict(item.split("=", 1) for item in args.metadata if "=" in item),
    }
    sweep = client.request("POST", "/v1/sweeps", json=body)
    ids = sweep["job_ids"]
    print(f"sweep {sweep['id']} queued: {len(ids)} jobs ({', '.join(map(str, ids))}), seeds {sweep['seeds']}")
    return 0


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
    lines.append("  " + _schedule_line(plan["schedule"]))
    lines.append("  " + _tokens_line(plan["tokens"]))
    lines.append("  " + _memory_line(plan["memory"]))
    lines += [f"  warning: {w}" for w in plan["warnings"]]
    return lines


def _schedule_line(schedule: dict[str, Any]) -> str:
    if schedule["status"] != "known":
        return f"schedule: unknown ({schedule['reason']})"
    steps = ", ".join(map(str, schedule["evaluation_steps"]))
    return (
        f"schedule: {schedule['steps_per_epoch']} steps/epoch × {schedule['epochs']} epochs = "
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
