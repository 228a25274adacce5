"""What a non-admin key reads of a job: no store URI, bucket, worker path or traceback (issue 35).

A job's row keeps where its files are (`output_dir`: the worker's folder or the store's URI; a
checkpoint row's `path`; `result.model_dir`; the reproducibility record's file paths): operators
need them, and an admin key is the operator. A user's laptop can do nothing with them, and they
tell a stranger to the machines how these are laid out. So for a non-admin:

- the job's folder, its model and a checkpoint are named by their API paths (`/v1/jobs/17/artifacts`,
  `/v1/jobs/17/artifacts/checkpoints/checkpoint-8`), beside which `download` gives the command;
- every other string of its result, reproducibility record, reproduction report and error goes
  through the worker's rules (shared/jobspec/user_text.py): a file under the data, GLUE or models
  folder becomes its path there (what the spec said), an uploaded file's cached copy its name, a Hub
  cache folder its repository id, an object of the store its key, any other absolute path its last
  part, and traceback blocks go;
- the job's log loses its traceback blocks and has its places rewritten alike (the log's text is
  the service's training code talking, not the user's: every frame is the machine's).

The API's settings name the folders it knows; a worker on another box with other folders is still
covered by the last rule, which needs no folder: its paths become their last parts.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from pydantic import ValidationError

from shared.core.artifact_links import artifact_path
from shared.core.config import Settings
from shared.core.tables import Job
from shared.jobspec.spec import JobSpec
from shared.jobspec.user_text import Places, drop_tracebacks, for_users, places_of


def checkpoint_path(job_id: int, step: int) -> str:
    """The API path of a checkpoint's folder (a GET answers it as a tar stream)."""
    return artifact_path(job_id, f"checkpoints/checkpoint-{step}")


def places_of_job(settings: Settings, job_id: int, spec: dict[str, Any] | None) -> Places:
    """The places of a job, remembered: building them resolves every folder on the disk and parses
    the spec (4 ms a job; a page of 100 jobs took 390 ms more for a user key than an admin's)."""
    spec = spec or {}
    # What the places depend on, and only that: the folders and the names the spec gives its files.
    names = json.dumps([spec.get("uploaded_files"), spec.get("registered_model")], sort_keys=True)
    folders = (
        settings.artifacts_dir,
        settings.cache_dir,
        settings.data_dir,
        settings.glue_dir,
        settings.models_dir,
        settings.storage_url,
        os.environ.get("AWS_ENDPOINT_URL"),
    )
    return _places(settings, job_id, spec, json.dumps([str(f) for f in folders]), names)


_CACHE: dict[tuple[str, int, str], Places] = {}
_CACHE_SIZE = 4096
_CACHE_LOCK = threading.Lock()  # sync routes run in a thread pool


def _places(settings: Settings, job_id: int, spec: dict[str, Any], folders: str, names: str) -> Places:
    key = (folders, job_id, names)
    found = _CACHE.get(key)
    if found is None:
        try:
            parsed = JobSpec.model_validate(spec) if spec else None
        except ValidationError:  # a spec an older version stored: its files fall to the generic rules
            parsed = None
        found = places_of(settings, [settings.job_dir(job_id)], parsed)
        with _CACHE_LOCK:
            if len(_CACHE) >= _CACHE_SIZE:
                _CACHE.pop(next(iter(_CACHE)))  # the oldest first: a dict keeps insertion order
            _CACHE[key] = found
    return found


def scrubbed(value: Any, places: Places) -> Any:
    """`value` (JSON) with every string as a user may read it; keys are left as they are."""
    if isinstance(value, str):
        # Only a string with a slash or a traceback can hold a place: the rest are left untouched
        # (and the regexes are not run over every number's name).
        return for_users(value, places) if "/" in value or "Traceback" in value else value
    if isinstance(value, dict):
        return {key: scrubbed(item, places) for key, item in value.items()}
    if isinstance(value, list):
        return [scrubbed(item, places) for item in value]
    return value


def job_fields_for_user(settings: Settings, job: Job, fields: dict[str, Any]) -> dict[str, Any]:
    """The place-holding fields of a job's view (output_dir, result, environment, reproduction,
    error), as a non-admin reads them."""
    places = places_of_job(settings, job.id, job.spec)
    shown = dict(fields)
    if shown.get("output_dir") is not None:
        shown["output_dir"] = artifact_path(job.id)
    result = shown.get("result")
    if isinstance(result, dict) and result.get("model_dir") is not None:
        # The final model is saved at the top of the job's folder (worker/training/outputs.py).
        result = {**result, "model_dir": artifact_path(job.id)}
    shown["result"] = scrubbed(result, places)
    for name in ("environment", "reproduction", "error"):
        if shown.get(name) is not None:
            shown[name] = scrubbed(shown[name], places)
    return shown


def log_for_user(settings: Settings, job: Job, text: str) -> str:
    """A job's log text as a non-admin reads it: no traceback blocks, no places of the machines."""
    if not text:
        return text
    places = places_of_job(settings, job.id, job.spec)
    kept = places.rewrite(drop_tracebacks(text))
    # drop_tracebacks trims the text's last newline; a follower appends the next chunk after it.
    return kept + "\n" if text.endswith("\n") and not kept.endswith("\n") else kept
