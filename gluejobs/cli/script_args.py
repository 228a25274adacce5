"""Command lines, shell scripts and config files of the recipes gluejobs replaces, as job specs.

Three ways people fine-tune on GLUE, each taken as the user has it:
- run_glue_no_trainer.py (Hugging Face's example), also behind `accelerate launch`;
- run_glue.py (transformers.Trainer; microsoft/LoRA's copy adds the LoRA flags), behind
  `python -m torch.distributed.launch`, `torchrun` or nothing, often inside a shell script that
  exports variables first;
- the Trainer page's recipe: TrainingArguments (and the data and model arguments) in a JSON or
  YAML file, as run_glue.py reads one.

Field names are the scripts' flags without the dashes, so most flags map one-for-one. This module
knows the rest: the launchers' process counts, the flags that only steer a script's bookkeeping
(accepted, with a note on what they mean here), and every flag that gluejobs cannot honour, which
is refused by name rather than dropped. No shell runs: a script's lines are read with shlex, and its
`$variables` expanded from its own assignments.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, TextIO, get_args, get_origin

from pydantic import ValidationError

from shared.jobspec import validation_messages
from shared.jobspec.column_mapping import COLUMN_FIELDS
from shared.jobspec.spec import LORA_OPTIONS, JobSpec, spec_keys
from shared.jobspec.suggest import did_you_mean


class ScriptArgsError(ValueError):
    """A command line that cannot become a job spec; the message names the flag."""


@dataclass
class Translation:
    """A spec dict (values as the user wrote them, so the API's errors name the field) and notes on
    what gluejobs does with the flags that mean something else in a service."""

    spec: dict[str, Any]
    notes: list[str] = field(default_factory=list)


# Scripts by file name, and the recipe each follows.
SCRIPT_RECIPES = {"run_glue_no_trainer.py": "no_trainer", "run_glue.py": "trainer"}

# Flags of the scripts (and Trainer) that have no place in a service: None refuses them, a text is
# the note that accepts them.
BOOKKEEPING_FLAGS: dict[str, str | None] = {
    "output_dir": "the service chooses each job's output folder (GLUEJOBS_ARTIFACTS_DIR/jobs/<id>)",
    "overwrite_output_dir": "every job writes into a fresh folder of its own",
    "logging_dir": "trackers write into the job's folder",
    "push_to_hub": None,
    "hub_model_id": None,
    "hub_token": None,
    "hub_strategy": None,
    "resume_from_checkpoint": None,
}
# run_glue.py's flags that gluejobs knows under another name.
RENAMED_FLAGS = {"max_steps": "max_train_steps"}
# run_glue.py's own defaults where they differ from run_glue_no_trainer.py's (its DataTrainingArguments).
RUN_GLUE_DEFAULTS = {"pad_to_max_length": "true"}
# Flags only run_glue.py (Trainer) has: a bare command line with one of them is a Trainer command line.
TRAINER_ONLY_FLAGS = ("do_train", "do_eval", "do_predict", "overwrite_output_dir")

# --- launchers --------------------------------------------------------------------------------------
# Their options: what each means for a job. "processes" gives num_processes; a note accepts it;
# None refuses it. Options without a value are listed in _LAUNCHER_SWITCHES.
_TORCH_LAUNCHER = {
    "nproc_per_node": "processes",
    "nnodes": "machines",
    "node_rank": None,
    "master_addr": None,
    "master_port": None,
    "rdzv_backend": "the worker sets up each job's rendezvous on its own machine",
    "rdzv_endpoint": "the worker sets up each job's rendezvous on its own machine",
    "rdzv_id": "the worker sets up each job's rendezvous on its own machine",
    "use_env": "the worker sets up each job's rendezvous on its own machine",
    "standalone": "the worker sets up each job's rendezvous on its own machine",
    "max_restarts": None,
}
_ACCELERATE_LAUNCHER = {
    "num_processes": "processes",
    "num_machines": "machines",
    "machine_rank": None,
    "mixed_precision": "mixed_precision",
    "multi_gpu": "the worker launches a job of several processes that way",
    "main_process_port": None,
    "main_process_ip": None,
    "dynamo_backend": "dynamo_no",
    "cpu": None,
    "gpu_ids": None,
    "config_file": None,
    "use_deepspeed": None,
    "use_fsdp": None,
}
_LAUNCHER_SWITCHES = {"use_env", "standalone", "multi_gpu", "cpu", "use_deepspeed", "use_fsdp"}
_SERVICE_SETS = "the service sets each machine's rank and the rendezvous"
_REFUSED_LAUNCHER_REASON = {
    "node_rank": _SERVICE_SETS,
    "machine_rank": _SERVICE_SETS,
    "master_addr": _SERVICE_SETS,
    "master_port": _SERVICE_SETS,
    "main_process_ip": _SERVICE_SETS,
    "main_process_port": _SERVICE_SETS,
    "max_restarts": "a job that fails is retried by the service (max_attempts)",
    "cpu": "the worker decides where a job runs",
    "gpu_ids": "the worker decides which devices a job gets (gluejobs worker --devices)",
    "config_file": "gluejobs reads no accelerate config file; pass its settings as launch flags",
    "use_deepspeed": "DeepSpeed is not supported",
    "use_fsdp": "FSDP is not supported",
}

# --- shell scripts ----------------------------------------------------------------------------------
# Exported variables that the recipes set for the job's process, not for the command line.
DETERMINISM_EXPORTS = {"CUBLAS_WORKSPACE_CONFIG": (":16:8", ":4096:8"), "PYTHONHASHSEED": None}
# Shell lines that prepare what the service prepares itself.
_HARMLESS_COMMANDS = {"set", "mkdir", "echo", "cd"}
_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::-([^}]*))?\}|(\w+))")
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
_PYTHON = re.compile(r"^python[0-9.]*$")


# ---------------------------------------------------------------------------------------------------
# The three inputs
# ---------------------------------------------------------------------------------------------------


def command_to_spec(words: list[str]) -> Translation:
    """A command line as the user would run it: bare flags (run_glue_no_trainer.py's, as
    `gluejobs submit` always took), `python SCRIPT …`, or either script behind a launcher."""
    translation = Translation({})
    words = _environment_assignments(words, translation)
    if not words:
        raise ScriptArgsError("no command: give the script's flags, or the command line that runs it")
    program, flags = _launcher(words, translation)
    recipe = _recipe_of(program, flags, translation)
    flags = _with_script_defaults(program, flags)
    translation.spec = {
        **translation.spec,
        **script_flags_to_spec(flags, recipe=recipe, notes=translation.notes),
    }
    return translation


def shell_script_to_spec(text: str, *, overrides: list[str] | None = None) -> Translation:
    """A shell script like microsoft/LoRA's configs: assignments and exports, then one command.

    `$var` and `${var}` expand from the script's own assignments (a variable it never sets expands
    to nothing, as in the shell, with a note). `overrides` are flags appended to the command.
    """
    variables: dict[str, str] = {}
    exported: dict[str, str] = {}
    unset: set[str] = set()
    referenced = {m.group(1) or m.group(3) for m in _VARIABLE.finditer(text)}
    command: list[str] | None = None
    notes: list[str] = []
    for number, line in _logical_lines(text):
        words = _split(_expand(line, variables, unset), number)
        if not words:
            continue
        if words[0] == "export" or all(_ASSIGNMENT.match(w) for w in words):
            for word in words[1:] if words[0] == "export" else words:
                name, _, value = word.partition("=")
                variables[name] = value
                if words[0] == "export":
                    exported[name] = value
            continue
        if words[0] in _HARMLESS_COMMANDS:
            notes.append(f"line {number}: `{words[0]}` skipped (the service prepares the job's folders)")
            continue
        if not _starts_a_training_command(words):
            raise ScriptArgsError(
                f"line {number}: `{words[0]}`: gluejobs runs one run_glue.py or run_glue_no_trainer.py "
                "command per job, and nothing else"
            )
        if command is not None:
            raise ScriptArgsError(f"line {number}: a second command; a job runs one training command")
        command = words
    if command is None:
        raise ScriptArgsError("the script runs no command")
    translation = command_to_spec(command + list(overrides or []))
    translation.notes[:0] = notes
    _check_exports(exported, referenced, translation)
    for name in sorted(unset):
        translation.notes.append(f"${name} is not set in the script: it expanded to nothing, as in the shell")
    return translation


def config_file_to_spec(path: Path, *, overrides: list[str] | None = None) -> Translation:
    """The Trainer page's recipe: TrainingArguments, with the model and data arguments beside them,
    in a JSON or YAML file (as run_glue.py reads one). It follows the trainer recipe unless it says
    otherwise; `overrides` are flags that replace its values."""
    values = _read_config(path)
    flags = ["--recipe", "trainer"] if "recipe" not in values else []
    known = flag_names()
    for key, value in values.items():
        if str(key) not in known:
            # The file's key, in the file's words (not as a command-line flag it never was).
            hint = did_you_mean(str(key), known)
            raise ScriptArgsError(f"{path.name}: unknown key {str(key)!r}{hint}")
        flags += _as_flag(str(key), value)
    translation = Translation({})
    translation.spec = script_flags_to_spec(flags + list(overrides or []), notes=translation.notes)
    return translation


def submission_spec(
    extra: list[str],
    *,
    script: Path | None,
    config: Path | None,
    dry_run: bool,
    err: TextIO,
    fast: bool = False,
) -> dict[str, Any]:
    """What `gluejobs submit` sends: from a script file, a config file, or the command line in
    `extra` (with a file, `extra` holds flags that override its values). Notes go to `err`; with
    `dry_run`, the spec comes back resolved (JobSpec-validated, every default filled in)."""
    if script is not None and config is not None:
        raise ScriptArgsError("give --script or --config, not both")
    if script is not None:
        try:
            text = script.read_text()
        except OSError as exc:
            raise ScriptArgsError(f"cannot read {script}: {exc}") from None
        translation = shell_script_to_spec(text, overrides=extra)
    elif config is not None:
        translation = config_file_to_spec(config, overrides=extra)
    else:
        translation = command_to_spec(extra)
    if fast:  # `gluejobs submit --fast`: the spec's switch (shared.jobspec.spec.FAST_SETTINGS)
        translation.spec["fast"] = True
    for note in translation.notes:
        print(f"note: {note}", file=err)
    return resolved_spec(translation.spec) if dry_run else translation.spec


def resolved_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as JobSpec validates it (defaults and the recipe's values filled in): what
    `gluejobs submit --dry-run` prints. The API adds only what needs its settings (paths, seed)."""
    try:
        return JobSpec.model_validate(spec).model_dump(mode="json")
    except ValidationError as exc:
        # The API's own words for the same refusal (shared/jobspec/validation_messages.py), so a spec refused
        # here reads as it would from the server.
        raise ScriptArgsError(
            validation_messages.problem(exc, prefix="spec", known=lambda _loc: spec_keys()).line()
        ) from None


# ---------------------------------------------------------------------------------------------------
# The scripts' flags
# ---------------------------------------------------------------------------------------------------


def script_flags_to_spec(
    flags: list[str], *, recipe: str | None = None, notes: list[str] | None = None
) -> dict[str, Any]:
    """Translate a script's flags into a spec dict (values stay strings where the API converts them,
    so its error names the field)."""
    notes = notes if notes is not None else []
    values, unknown = _flag_parser().parse_known_args(flags)
    if unknown:
        raise ScriptArgsError(_unknown_flag(unknown))
    spec: dict[str, Any] = {"recipe": recipe} if recipe else {}
    for name, value in vars(values).items():
        if value is None:
            continue
        if name == "do_train":
            _do_train_flag(value, spec, notes)
        elif name in BOOKKEEPING_FLAGS:
            _bookkeeping_flag(name, value, notes)
        elif name == "use_fast_tokenizer":
            spec["use_slow_tokenizer"] = "false" if _truthy(value) else "true"
        else:
            spec[RENAMED_FLAGS.get(name, name)] = value
    if (
        "trainer" in (recipe, values.recipe)
        and values.do_train is None
        and (_truthy(values.do_eval) or _truthy(values.do_predict))
    ):
        # run_glue.py trains only when told to: --do_eval or --do_predict alone evaluates or predicts.
        spec["do_train"] = "false"
        flag = "--do_eval" if _truthy(values.do_eval) else "--do_predict"
        notes.append(
            f"{flag} without --do_train: an evaluation or prediction job (no training), as in run_glue.py"
        )
    if not _truthy(spec.get("apply_lora", "false")):
        given = [name for name in LORA_OPTIONS if name in spec]
        if given:
            raise ScriptArgsError(f"--{given[0]} has no effect without --apply_lora")
    return spec


def _flag_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gluejobs submit", add_help=False, allow_abbrev=False)
    for name, info in JobSpec.model_fields.items():
        _add_flag(parser, name, [f"--{n}" for n in _spec_flags(name, info)], info.annotation)
    for name in _VALUE_FLAGS:
        parser.add_argument(f"--{name}", default=None)
    for name in _SWITCHES:
        parser.add_argument(f"--{name}", nargs="?", const="true", default=None)
    return parser


# Flags beside the spec's fields: the script's and Trainer's names for them, and bookkeeping.
_VALUE_FLAGS = ("checkpointing_steps", *RENAMED_FLAGS)
_SWITCHES = (*BOOKKEEPING_FLAGS, "use_fast_tokenizer")


def _spec_flags(name: str, info: Any) -> list[str]:
    """A spec field's flag names: the field's, its aliases', and Trainer's warmup_steps."""
    names = [name]
    alias = info.validation_alias
    if alias is not None and hasattr(alias, "choices"):
        names += [c for c in alias.choices if isinstance(c, str) and c != name]
    if name == "num_warmup_steps":
        names.append("warmup_steps")  # Trainer's name; the spec takes either
    if name in COLUMN_FIELDS:  # AutoTrain spells its column flags with dashes (--text-column)
        names += [n.replace("_", "-") for n in names]
    return names


def flag_names() -> list[str]:
    """Every flag a command line may give (without its dashes), and so every key of a config file."""
    fields = [flag for name, info in JobSpec.model_fields.items() for flag in _spec_flags(name, info)]
    return [*fields, *_VALUE_FLAGS, *_SWITCHES]


def _unknown_flag(unknown: list[str]) -> str:
    """The first unknown flag, by name, with its near match among the known ones."""
    flag = next((word for word in unknown if word.startswith("-")), unknown[0])
    if not flag.startswith("-"):
        return f"{flag!r}: a value without a flag before it"
    name = flag.lstrip("-").partition("=")[0]
    hint = did_you_mean(name, flag_names(), prefix="--", quote=False)
    return f"--{name}: unknown flag{hint} (see `gluejobs submit --help` and the job spec)"


def _add_flag(parser: argparse.ArgumentParser, name: str, flags: list[str], annotation: Any) -> None:
    if _is_bool(annotation):
        parser.add_argument(*flags, dest=name, nargs="?", const="true", default=None)
    elif _is_list(annotation):
        parser.add_argument(*flags, dest=name, nargs="+", default=None)
    else:
        parser.add_argument(*flags, dest=name, default=None)


def _do_train_flag(value: str, spec: dict[str, Any], notes: list[str]) -> None:
    """--do_train trains (what every job does unless told otherwise); --do_train false asks for an
    evaluation or prediction job."""
    if _truthy(value):
        notes.append("--do_train: the job trains")
    else:
        spec["do_train"] = value


def _bookkeeping_flag(name: str, value: str, notes: list[str]) -> None:
    reason = BOOKKEEPING_FLAGS[name]
    if reason is None:
        if name == "push_to_hub" and not _truthy(value):
            return  # push_to_hub false asks for nothing
        raise ScriptArgsError(f"--{name} is not supported by the service")
    notes.append(f"--{name}: {reason}")


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes", "y")


def _is_bool(annotation: Any) -> bool:
    """bool or bool | None: flags that may stand alone (`--fp16`) or take a value (`--fp16 false`)."""
    if annotation is bool:
        return True
    return (
        get_origin(annotation) is not None
        and bool in get_args(annotation)
        and get_origin(annotation) is not list
    )


def _is_list(annotation: Any) -> bool:
    return get_origin(annotation) is list or any(get_origin(a) is list for a in get_args(annotation))


# ---------------------------------------------------------------------------------------------------
# Launchers and programs
# ---------------------------------------------------------------------------------------------------


def _launcher(words: list[str], translation: Translation) -> tuple[str | None, list[str]]:
    """The program (None for bare flags) and its flags; the launcher's options go into the spec."""
    first = PurePath(words[0]).name
    if first.startswith("-"):
        return None, words
    if _PYTHON.match(first):
        if len(words) > 2 and words[1] == "-m":
            module, rest = words[2], words[3:]
            if module in ("torch.distributed.launch", "torch.distributed.run"):
                return _launch(rest, _TORCH_LAUNCHER, module, translation)
            if module == "accelerate.commands.launch":
                return _launch(rest, _ACCELERATE_LAUNCHER, module, translation)
            raise ScriptArgsError(f"python -m {module}: not a launcher gluejobs knows")
        return _program(words[1:])
    if first == "torchrun":
        return _launch(words[1:], _TORCH_LAUNCHER, "torchrun", translation)
    if first == "accelerate" and len(words) > 1 and words[1] == "launch":
        return _launch(words[2:], _ACCELERATE_LAUNCHER, "accelerate launch", translation)
    return _program(words)


def _starts_a_training_command(words: list[str]) -> bool:
    first = next((word for word in words if not _ASSIGNMENT.match(word)), "")
    name = PurePath(first).name
    return bool(_PYTHON.match(name)) or name in ("torchrun", "accelerate", *SCRIPT_RECIPES)


def _program(words: list[str]) -> tuple[str, list[str]]:
    if not words or words[0].startswith("-"):
        raise ScriptArgsError("no script to run: expected run_glue.py or run_glue_no_trainer.py")
    name = PurePath(words[0]).name
    if name not in SCRIPT_RECIPES:
        raise ScriptArgsError(
            f"{words[0]}: gluejobs runs run_glue_no_trainer.py and run_glue.py command lines, not {name}"
        )
    return name, words[1:]


def _launch(
    words: list[str], options: dict[str, str | None], launcher: str, translation: Translation
) -> tuple[str, list[str]]:
    index = 0
    while index < len(words) and words[index].startswith("-"):
        option, _, inline = words[index].lstrip("-").partition("=")
        name = option.replace("-", "_")
        if name not in options:
            raise ScriptArgsError(f"{launcher} --{option}: not a launch option gluejobs knows")
        value: str | None = None
        if name not in _LAUNCHER_SWITCHES:
            if inline:
                value = inline
            elif index + 1 < len(words):
                index += 1
                value = words[index]
            else:
                raise ScriptArgsError(f"{launcher} --{option} needs a value")
        _launch_option(launcher, option, options[name], value, translation)
        index += 1
    return _program(words[index:])


def _launch_option(
    launcher: str, option: str, meaning: str | None, value: str | None, translation: Translation
) -> None:
    shown = f"{launcher} --{option}" + (f" {value}" if value is not None else "")
    if meaning is None:
        reason = _REFUSED_LAUNCHER_REASON.get(option.replace("-", "_"), "")
        raise ScriptArgsError(f"{shown}: not supported" + (f" ({reason})" if reason else ""))
    if meaning == "processes":
        if value is None or not value.isdigit() or int(value) < 1:
            raise ScriptArgsError(f"{shown}: needs a number of processes")
        translation.spec["num_processes"] = value
    elif meaning == "machines":
        # torchrun's --nnodes MIN:MAX is an elastic range: only a fixed count (MIN = MAX) is taken.
        low, _, high = (value or "").partition(":")
        if not low.isdigit() or int(low) < 1 or (high and high != low):
            raise ScriptArgsError(
                f"{shown}: needs a number of machines (a fixed one: elastic membership is not supported)"
            )
        if int(low) > 1:
            translation.spec["num_machines"] = low
    elif meaning == "mixed_precision":
        if value not in ("no", "fp16", "bf16"):
            raise ScriptArgsError(f"{shown}: expected no, fp16 or bf16")
        if value != "no":
            translation.spec[value] = "true"
    elif meaning == "dynamo_no":
        if value not in ("no", "NO"):
            raise ScriptArgsError(f"{shown}: torch.compile through dynamo is not supported")
    else:
        translation.notes.append(f"{shown}: {meaning}")


def _recipe_of(program: str | None, flags: list[str], translation: Translation) -> str | None:
    if program is not None:
        return SCRIPT_RECIPES[program]
    trainer_flags = [f for f in flags if f.lstrip("-").partition("=")[0] in TRAINER_ONLY_FLAGS]
    if trainer_flags and "--recipe" not in flags:
        translation.notes.append(f"{trainer_flags[0]} is run_glue.py's (Trainer's): recipe trainer")
        return "trainer"
    return None


def _with_script_defaults(program: str | None, flags: list[str]) -> list[str]:
    """run_glue.py's defaults that differ from run_glue_no_trainer.py's, where its flags leave them."""
    if program != "run_glue.py":
        return flags
    given = {f.lstrip("-").partition("=")[0] for f in flags if f.startswith("--")}
    extra = [
        word
        for name, value in RUN_GLUE_DEFAULTS.items()
        if name not in given
        for word in (f"--{name}", value)
    ]
    return extra + flags


def _environment_assignments(words: list[str], translation: Translation) -> list[str]:
    """`NAME=value python …`: variables set for the command alone."""
    index = 0
    exported: dict[str, str] = {}
    while index < len(words) and _ASSIGNMENT.match(words[index]):
        name, _, value = words[index].partition("=")
        exported[name] = value
        index += 1
    _check_exports(exported, set(), translation)
    return words[index:]


def _check_exports(exported: dict[str, str], referenced: set[str], translation: Translation) -> None:
    """Exported variables that the command line uses are shell variables; the others would be the
    job's environment, which gluejobs sets itself: the recipes' determinism variables are accepted
    (the worker sets them for use_deterministic_algorithms), anything else is refused by name."""
    for name, value in exported.items():
        if name in referenced:
            continue
        if name not in DETERMINISM_EXPORTS:
            raise ScriptArgsError(
                f"export {name}={value}: gluejobs does not pass environment variables to a job "
                "(the worker sets the job's environment)"
            )
        allowed = DETERMINISM_EXPORTS[name]
        if (allowed is not None and value not in allowed) or (allowed is None and not value.isdigit()):
            raise ScriptArgsError(
                f"export {name}={value}: gluejobs sets {name} to its own deterministic value"
            )
        deterministic = _truthy(translation.spec.get("use_deterministic_algorithms", "false"))
        translation.notes.append(
            f"export {name}: the worker sets it for jobs with use_deterministic_algorithms"
            + ("" if deterministic else " (this command does not ask for deterministic algorithms)")
        )


# ---------------------------------------------------------------------------------------------------
# Reading shell scripts and config files
# ---------------------------------------------------------------------------------------------------


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines with their continuations (a trailing backslash) joined, numbered as in the file."""
    lines: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not pending:
            start = number
        if line.rstrip().endswith("\\") and not line.lstrip().startswith("#"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append((start, pending + line))
        pending = ""
    if pending:
        lines.append((start, pending))
    return lines


def _split(line: str, number: int) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError as exc:
        raise ScriptArgsError(f"line {number}: {exc}") from None


def _expand(line: str, variables: dict[str, str], unset: set[str]) -> str:
    """`$var`, `${var}` and `${var:-default}` replaced as the shell would, outside single quotes.

    The values are quoted for shlex so that they stay literal text: inside double quotes as one
    word, outside split at whitespace (the shell's word splitting).
    """
    out: list[str] = []
    quote: str | None = None
    index = 0
    while index < len(line):
        char = line[index]
        if char == "\\" and quote != "'":
            out.append(line[index : index + 2])
            index += 2
            continue
        if char in "'\"" and quote in (None, char):
            quote = None if quote == char else char
        elif char == "$" and quote != "'":
            match = _VARIABLE.match(line, index)
            if match is not None:
                name = match.group(1) or match.group(3)
                value = variables.get(name)
                if value is None:
                    value = match.group(2) or ""
                    if match.group(2) is None:
                        unset.add(name)
                out.append(_quoted(value, in_double_quotes=quote == '"'))
                index = match.end()
                continue
            if line.startswith("$(", index):
                raise ScriptArgsError("command substitution $(…) is not supported: gluejobs runs no shell")
        elif char == "`" and quote != "'":
            raise ScriptArgsError("command substitution `…` is not supported: gluejobs runs no shell")
        out.append(char)
        index += 1
    return "".join(out)


def _quoted(value: str, *, in_double_quotes: bool) -> str:
    if in_double_quotes:
        return re.sub(r'(["\\$`])', r"\\\1", value)
    return " ".join(shlex.quote(word) for word in value.split())


def _read_config(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScriptArgsError(f"cannot read {path}: {exc}") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        values = _load_yaml(path, text)
    else:
        try:
            values = json.loads(text)
        except ValueError as exc:
            raise ScriptArgsError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(values, dict):
        raise ScriptArgsError(f"{path} must hold one mapping of argument names to values")
    return values


def _load_yaml(path: Path, text: str) -> Any:
    try:
        import yaml  # PyYAML: installed with the worker stack (accelerate needs it), not with the client
    except ImportError:
        raise ScriptArgsError(
            f"{path}: reading YAML needs PyYAML (pip install pyyaml); or give JSON"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScriptArgsError(f"{path} is not valid YAML: {exc}") from None


def _as_flag(key: str, value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, bool):
        return [f"--{key}", "true" if value else "false"]
    if isinstance(value, list):
        return [f"--{key}", *map(str, value)] if value else [f"--{key}", "none"] if key == "report_to" else []
    if isinstance(value, float) and value.is_integer() and key == "max_steps":
        value = int(value)  # TrainingArguments writes numbers as floats in places; max_steps is a count
    if key == "max_steps" and value == -1:
        return []  # Trainer's "no limit"
    return [f"--{key}", str(value)]
