"""`gluejobs search`: hyperparameter searches from the command line.

`gluejobs search create <the script's flags> --space learning_rate=float:1e-5:1e-3:log --trials 8`
starts one (more `--space`: `int:LOW:HIGH`, `choice:16,32`; `--sampler tpe|random`, `--pruner
median|asha|none`, `--metric`, `--direction`); `search ls`, `search show ID` (the best trial and the
trials table: state, parameters, the objective at each evaluation, where a pruned one stopped),
`search cancel ID` and `search seeds ID --seeds 0,1,2` (the best configuration over seeds).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from gluejobs import job_view
from gluejobs.client import Client, Search
from gluejobs.output import print_json, table
from gluejobs.research_cli import parse_seeds

AddClientCommand = Callable[..., argparse.ArgumentParser]
SEARCH_COMMANDS = ("create", "ls", "show", "cancel", "seeds")


def add_command(commands: Any, client_command: AddClientCommand) -> None:
    search = client_command(
        commands,
        "search",
        help="hyperparameter search: `search create <the script's flags> --space …`, `ls`, `show ID`, "
        "`cancel ID`, `seeds ID --seeds 0,1,2`",
        allow_abbrev=False,
        description="Trials are ordinary jobs; the service asks Optuna's sampler for each trial's values "
        "and stops trials whose evaluations fall behind (the pruner). --space FIELD=float:LOW:HIGH[:log], "
        "FIELD=int:LOW:HIGH[:log] or FIELD=choice:A,B,C; the other flags are run_glue_no_trainer.py's.",
    )
    search.add_argument("--space", action="append", default=[], metavar="FIELD=KIND:…")
    search.add_argument("--trials", type=int, default=10, help="the trial budget")
    search.add_argument("--parallelism", type=int, default=2, help="trials queued at once")
    search.add_argument("--sampler", default="tpe", help="tpe or random")
    search.add_argument("--pruner", default="median", help="median, asha or none")
    search.add_argument("--metric", help="the objective (default: the task's main metric)")
    search.add_argument("--direction", help="maximize or minimize (default: the metric's own)")
    search.add_argument("--seeds", default="", help="search seeds: comma-separated seeds")
    search.add_argument("--priority", type=int, default=0)
    search.add_argument("--max-attempts", type=int, default=3)
    search.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    search.add_argument("--json", action="store_true", help="the API's answer: one JSON document")


def parse_space(items: list[str]) -> dict[str, dict[str, Any]]:
    """--space learning_rate=float:1e-5:1e-3:log, batch=int:8:32, per_device_train_batch_size=choice:16,32."""
    from gluejobs.research_cli import _value
    from gluejobs.script_args import ScriptArgsError

    space: dict[str, dict[str, Any]] = {}
    for item in items:
        name, sep, rest = item.partition("=")
        kind, _, values = rest.partition(":")
        name = name.strip().lstrip("-")
        if not sep or not name or kind not in ("float", "int", "choice") or not values:
            raise ScriptArgsError(
                f"--space takes FIELD=float:LOW:HIGH[:log], FIELD=int:LOW:HIGH[:log] or FIELD=choice:A,B, "
                f"not {item!r}"
            )
        if kind == "choice":
            space[name] = {"type": "categorical", "choices": [_value(v.strip()) for v in values.split(",")]}
            continue
        parts = values.split(":")
        log = parts[-1] == "log"
        if log:
            parts = parts[:-1]
        if len(parts) != 2:
            raise ScriptArgsError(f"--space {name}: give LOW:HIGH, e.g. {name}={kind}:1e-5:1e-3:log")
        number = float if kind == "float" else int
        try:
            low, high = number(parts[0]), number(parts[1])
        except ValueError:
            raise ScriptArgsError(f"--space {name}: {parts[0]!r} and {parts[1]!r} must be {kind}s") from None
        space[name] = {"type": kind, "low": low, "high": high, "log": log}
    return space


def run_search(args: argparse.Namespace, extra: list[str], client: Client) -> int:
    from gluejobs.script_args import ScriptArgsError

    if not extra or extra[0] not in SEARCH_COMMANDS:
        raise ScriptArgsError(f"search takes one of {', '.join(SEARCH_COMMANDS)} (gluejobs search create …)")
    command, operands = extra[0], extra[1:]
    if command == "create":
        return _create(args, operands, client)
    if command == "ls":
        searches = list(client.searches.list())
        if args.json:
            print_json([s.raw for s in searches])
        else:
            print("\n".join(table(COLUMNS, [_row(s) for s in searches], right={"id", "trials"})))
        return 0
    if len(operands) != 1 or not operands[0].isdigit():
        raise ScriptArgsError(f"search {command} takes one search id (gluejobs search {command} ID)")
    search_id = int(operands[0])
    if command == "show":
        search = client.searches.get(search_id)
    elif command == "cancel":
        search = client.searches.cancel(search_id)
    else:
        seeds = parse_seeds(args.seeds)
        if not seeds:
            raise ScriptArgsError("search seeds takes --seeds 0,1,2")
        search = client.searches.rerun_best(search_id, seeds)
    if args.json:
        print_json(search.raw)
    else:
        print("\n".join(search_lines(search)))
    return 0


def _create(args: argparse.Namespace, flags: list[str], client: Client) -> int:
    from gluejobs.script_args import ScriptArgsError, script_flags_to_spec

    notes: list[str] = []
    spec = script_flags_to_spec(flags, notes=notes)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    space = parse_space(args.space)
    if not space:
        raise ScriptArgsError("search create needs --space, e.g. --space learning_rate=float:1e-5:1e-3:log")
    objective = {k: v for k, v in (("metric", args.metric), ("direction", args.direction)) if v}
    search = client.searches.create(
        spec,
        space,
        objective=objective,
        n_trials=args.trials,
        parallelism=args.parallelism,
        sampler={"type": args.sampler},
        pruner={"type": args.pruner},
        priority=args.priority,
        max_attempts=args.max_attempts,
        metadata=dict(item.split("=", 1) for item in args.metadata if "=" in item),
    )
    if args.json:
        print_json(search.raw)
    else:
        ids = ", ".join(map(str, search.job_ids))
        print(f"search {search.id} started: {search.n_trials} trials, first jobs {ids}")
    return 0


COLUMNS = ("id", "status", "trials", "counts", "objective", "best", "task", "created")


def _row(search: Search) -> list[str]:
    best = search.best
    return [
        str(search.id),
        search.status,
        str(search.n_trials),
        _counts(search),
        f"{search.objective.get('metric')} ({search.objective.get('direction')})",
        f"{best['value']:.4f} (trial {best['number']})" if best else "-",
        str(search.spec.get("task_name") or search.spec.get("train_file") or ""),
        job_view.when(search.created_at),
    ]


def _counts(search: Search) -> str:
    return ", ".join(f"{n} {state}" for state, n in search.trial_counts.items() if n)


def search_lines(search: Search) -> list[str]:
    """`gluejobs search show`: the search, its best trial, and one line per trial."""
    metric = search.objective.get("metric")
    lines = [
        f"search {search.id}: {search.status} ({_counts(search)}); {search.n_trials} trials, "
        f"{metric} ({search.objective.get('direction')}), sampler {search.sampler.get('type')}, "
        f"pruner {search.pruner.get('type')}"
    ]
    if search.note:
        lines.append(f"  note: {search.note}")
    if search.best:
        params = " ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in search.best["params"].items()
        )
        lines.append(
            f"  best: trial {search.best['number']} (job {search.best['job_id']}): {params}: "
            f"{metric} {search.best['value']:.4f}"
        )
    rows = []
    for trial in search.trials or []:
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
    if search.seeds:
        median = search.seeds.get("median")
        lines.append(
            f"  seeds {search.seeds['seeds']} (sweep {search.seeds['sweep_id']}, {search.seeds['status']}): "
            + (f"median {metric} {median:.4f}" if median is not None else "no seed finished yet")
        )
    return lines
