"""Command lines of the scripts gluejobs replaces, translated into job specs.

Field names are run_glue_no_trainer.py's flags without the dashes, so most flags map one-for-one;
this module knows the few that need a word (`--checkpointing_steps`) or have no place in a service.
"""

from __future__ import annotations

import argparse
from typing import Any, get_args, get_origin

from shared.spec import JobSpec


class ScriptArgsError(ValueError):
    """A command line that cannot become a job spec; the message names the flag."""


# Flags of run_glue_no_trainer.py that have no place in a service, and why.
UNSUPPORTED_SCRIPT_FLAGS = {
    "output_dir": "the service chooses each job's output folder (GLUEJOBS_ARTIFACTS_DIR/jobs/<id>); ignored",
    "push_to_hub": None,
    "hub_model_id": None,
    "hub_token": None,
    "resume_from_checkpoint": None,
}


def script_flags_to_spec(flags: list[str], *, notes: list[str] | None = None) -> dict[str, Any]:
    """Translate run_glue_no_trainer.py's command line into a spec dict (values stay strings where the
    API converts them, so its error names the field)."""
    parser = argparse.ArgumentParser(prog="gluejobs submit", add_help=False)
    for name, info in JobSpec.model_fields.items():
        names = [name]
        alias = info.validation_alias
        if alias is not None and hasattr(alias, "choices"):
            names += [c for c in alias.choices if isinstance(c, str) and c != name]
        flags_for = [f"--{n}" for n in names]
        if _is_bool(info.annotation):
            parser.add_argument(*flags_for, dest=name, nargs="?", const="true", default=None)
        elif _is_list(info.annotation):
            parser.add_argument(*flags_for, dest=name, nargs="+", default=None)
        else:
            parser.add_argument(*flags_for, dest=name, default=None)
    parser.add_argument("--checkpointing_steps", default=None)
    for name in UNSUPPORTED_SCRIPT_FLAGS:
        parser.add_argument(f"--{name}", nargs="?", const="true", default=None)
    values, unknown = parser.parse_known_args(flags)
    if unknown:
        raise ScriptArgsError(
            f"unknown flag(s): {' '.join(unknown)} (see `gluejobs submit --help` and the job spec)"
        )
    spec: dict[str, Any] = {}
    for name, value in vars(values).items():
        if value is None:
            continue
        if name in UNSUPPORTED_SCRIPT_FLAGS:
            reason = UNSUPPORTED_SCRIPT_FLAGS[name]
            if reason is None:
                raise ScriptArgsError(f"--{name} is not supported by the service")
            if notes is not None:
                notes.append(f"--{name}: {reason}")
            continue
        spec[name] = value
    return spec


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
