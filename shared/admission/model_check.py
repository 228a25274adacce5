"""Whether a job's model exists, checked when the job is submitted rather than when a worker loads it.

A name is a folder under GLUEJOBS_MODELS_DIR or a Hub id (shared.jobspec.spec.locate_model, the workers' own
rule). A folder must exist. A Hub id is looked for where a worker would find it without the network
— the Hub cache (HF_HUB_CACHE, which the API and the workers share as they share the models folder)
— and, when it is not there, on the Hub itself (HF_ENDPOINT), for at most GLUEJOBS_HUB_CHECK_TIMEOUT_S.
A name the Hub does not have is refused with the near matches among the local folders and the cached
ids ("did you mean"). An API that is offline by configuration (HF_HUB_OFFLINE=1) refuses a Hub id
that is not in the Hub cache, naming it: the API shares the workers' cache, and what it was told not to
download is not known to exist. One that could not ask the Hub (no network, a timeout; or told not to
ask: GLUEJOBS_HUB_CHECK_TIMEOUT_S 0) accepts the job with a warning that says so, and the same near
matches.

A bare name (no `org/`) that is not a folder but names one of the caller's registered models is
refused with "did you mean 'model:NAME'": registered models are named with the prefix, and a worker
would look for the bare name on the Hub. Only where the Hub cache or the Hub itself has a model of that
name is it taken as the Hub's, with a warning naming the registered one.

The Hub's answers are remembered for a few minutes, and an unreachable Hub for a minute, so the
hundred combinations of a sweep ask once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from shared.core.config import Settings
from shared.core.errors import InvalidSpec
from shared.core.storage import StoreUnavailable, open_store
from shared.data.reading import UNKNOWN_MODEL_LABELS, ModelLabels, model_labels, reads_model_labels
from shared.jobspec.registered_models import PREFIX, RegisteredModel, is_registered, reference
from shared.jobspec.spec import JobSpec, locate_model
from shared.jobspec.suggest import did_you_mean
from shared.model_folders.cache import cached_model
from shared.model_folders.model_size import check_model_size, read_config
from shared.model_folders.reading import api_model_folder

FIELD = "model_name_or_path"
# A models folder is listed this deep (`name` and `org/name`), at most this many entries, for the
# near matches of a mistyped name.
MAX_LISTED_MODELS = 2000
FOUND_TTL_S = 600.0
MISSING_TTL_S = 60.0
UNREACHABLE_TTL_S = 60.0
_TRUE = ("1", "true", "yes", "on")

# OFFLINE: the API is offline by configuration (HF_HUB_OFFLINE), so an id not in the Hub cache is refused.
FOUND, MISSING, UNKNOWN, OFFLINE = "found", "missing", "unknown", "offline"


def check_model(
    model_name: str,
    settings: Settings,
    warnings: list[str],
    *,
    registered: RegisteredModel | None = None,
    is_own_model: Callable[[str], bool] = lambda _name: False,
) -> None:
    """Refuse (InvalidSpec) a model that does not exist, or whose config.json declares a shape past
    GLUEJOBS_MAX_MODEL_PARAMETERS (a local folder, a registered model: `registered`, the spec's
    record of it); append to `warnings` when it could not be checked. `model_name` is the spec's name
    as it will be stored; a registered model (`model:NAME`) was found when the spec's names were
    resolved (shared.jobspec.spec.check_paths). `is_own_model(name)` says whether the caller has a
    registered model of that name (a bare name missing its prefix)."""
    if is_registered(model_name):
        if registered is not None:
            _check_registered_size(registered, settings, warnings)
        return
    source = locate_model(model_name, settings.models_dir)
    if isinstance(source, Path):
        if not settings.check_data_on_submit:
            warnings.append(
                f"{FIELD}: the folder {model_name!r} was not checked (GLUEJOBS_CHECK_DATA_ON_SUBMIT is off)"
            )
        elif not source.is_dir():
            hint = did_you_mean(model_name, local_models(settings.models_dir))
            raise InvalidSpec(f"no model folder {model_name!r} in GLUEJOBS_MODELS_DIR{hint}", field=FIELD)
        else:
            _check_size(source / "config.json", settings)
        return
    # Registered names hold no "/": an `org/name` is the Hub's whatever the caller registered.
    own = reference(model_name) if "/" not in model_name and is_own_model(model_name) else None
    if in_hub_cache(model_name):
        _beside_own(model_name, own, "in the Hub cache", warnings)
        return
    answer, reason = hub_lookup(model_name, settings.hub_check_timeout_s)
    if answer == FOUND:
        _beside_own(model_name, own, "on the Hub", warnings)
        return
    where = "neither a folder in GLUEJOBS_MODELS_DIR nor in the Hub cache"
    if own is not None:
        raise InvalidSpec(
            f"{model_name!r} is {where}, but one of your registered models is named so: did you mean "
            f"{own!r}? (a registered model is named with the {PREFIX!r} prefix)",
            field=FIELD,
        )
    hint = did_you_mean(model_name, [*local_models(settings.models_dir), *cached_hub_ids()])
    if answer == MISSING:
        raise InvalidSpec(f"{model_name!r} is {where}, and the Hub has no such model{hint}", field=FIELD)
    if answer == OFFLINE:
        raise InvalidSpec(
            f"{model_name!r} is {where}, and {reason}, so it is not taken on trust: put it in the Hub "
            f"cache the API and the workers share or in GLUEJOBS_MODELS_DIR, or register it (gluejobs "
            f"models upload){hint}",
            field=FIELD,
        )
    warnings.append(
        f"{FIELD}: could not check {model_name!r}: it is {where}, and {reason}; a worker will try to "
        f"download it{hint}"
    )


def _beside_own(model_name: str, own: str | None, where: str, warnings: list[str]) -> None:
    if own is not None:
        warnings.append(
            f"{FIELD}: {model_name!r} is the model {where}, not your registered model of that name "
            f"(name that one {own!r})"
        )


def _check_size(config_path: Path, settings: Settings) -> None:
    config = read_config(config_path)  # capped; a missing or unreadable one is the worker's to report
    if config is not None:
        check_model_size(config, settings.max_model_parameters, field=FIELD, error=InvalidSpec)


def _check_registered_size(registered: RegisteredModel, settings: Settings, warnings: list[str]) -> None:
    """A registered model was sized at upload; checked again for one registered before the check
    existed or before GLUEJOBS_MAX_MODEL_PARAMETERS was lowered. Its config comes from this machine's
    copy of its config and tokenizer files (fetched once, as the dry run does)."""
    try:
        folder = cached_model(
            open_store(settings), settings.cache_dir, registered.sha256, tokenizer_only=True
        )
    except StoreUnavailable:
        warnings.append(f"{FIELD}: the model's size could not be checked: the file store did not answer")
        return
    _check_size(folder / "config.json", settings)


def local_models(models_dir: Path) -> list[str]:
    """The model folders under GLUEJOBS_MODELS_DIR, as a spec names them (`name`, `org/name`)."""
    names: list[str] = []
    try:
        with os.scandir(models_dir) as top:
            for entry in top:
                if len(names) >= MAX_LISTED_MODELS:
                    break
                if not entry.is_dir() or entry.name.startswith("."):
                    continue
                if (Path(entry.path) / "config.json").is_file():
                    names.append(entry.name)
                    continue
                with os.scandir(entry.path) as inner:  # an organisation's folder: org/name
                    names += [f"{entry.name}/{sub.name}" for sub in inner if sub.is_dir()]
    except OSError:
        return names
    return names


def hub_cache_dir() -> Path:
    """The Hub cache the workers read models from: HF_HUB_CACHE, else HF_HOME/hub (huggingface_hub's
    own default otherwise)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def in_hub_cache(repo_id: str) -> bool:
    """Whether the Hub cache holds a snapshot of `repo_id` with its config (what a worker offline
    loads it from)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=hub_cache_dir())
    return isinstance(found, str)


def cached_hub_ids() -> list[str]:
    """The model ids in the Hub cache (its `models--org--name` folders)."""
    try:
        with os.scandir(hub_cache_dir()) as entries:
            return [
                entry.name.removeprefix("models--").replace("--", "/")
                for entry in entries
                if entry.name.startswith("models--")
            ][:MAX_LISTED_MODELS]
    except OSError:
        return []


class _Answers:
    """The Hub's recent answers per model id, and whether it was found unreachable lately."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: dict[tuple[str, str], tuple[float, str, str]] = {}
        self._unreachable: dict[str, tuple[float, str]] = {}

    def get(self, endpoint: str, repo_id: str) -> tuple[str, str] | None:
        now = time.monotonic()
        with self._lock:
            down = self._unreachable.get(endpoint)
            if down is not None and down[0] > now:
                return UNKNOWN, down[1]
            cached = self._answers.get((endpoint, repo_id))
            if cached is not None and cached[0] > now:
                return cached[1], cached[2]
        return None

    def put(self, endpoint: str, repo_id: str, answer: str, reason: str, *, reachable: bool) -> None:
        now = time.monotonic()
        with self._lock:
            if not reachable:
                self._unreachable[endpoint] = (now + UNREACHABLE_TTL_S, reason)
                return
            ttl = FOUND_TTL_S if answer == FOUND else MISSING_TTL_S
            self._answers[(endpoint, repo_id)] = (now + ttl, answer, reason)


_answers = _Answers()


def hub_lookup(repo_id: str, timeout_s: float) -> tuple[str, str]:
    """(FOUND | MISSING | UNKNOWN | OFFLINE, why it is unknown) for a model id, from the Hub's model API."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE:
        return OFFLINE, "the API is offline (HF_HUB_OFFLINE)"
    if timeout_s <= 0:
        return UNKNOWN, "the API does not ask the Hub (GLUEJOBS_HUB_CHECK_TIMEOUT_S is 0)"
    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    cached = _answers.get(endpoint, repo_id)
    if cached is not None:
        return cached
    token = os.environ.get("HF_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(f"{endpoint}/api/models/{repo_id}", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        reason = f"the Hub ({endpoint}) could not be reached from the API ({type(exc).__name__})"
        _answers.put(endpoint, repo_id, UNKNOWN, reason, reachable=False)
        return UNKNOWN, reason
    # The Hub answers 401 (not 404) for a repository that does not exist when asked without a token,
    # and says which it is in X-Error-Code; a gated model exists.
    code = response.headers.get("x-error-code", "")
    if response.status_code == 200 or code == "GatedRepo":
        answer, reason = FOUND, ""
    elif response.status_code == 404 or code == "RepoNotFound":
        answer, reason = MISSING, ""
    else:
        answer, reason = UNKNOWN, f"the Hub answered {response.status_code}"
    _answers.put(endpoint, repo_id, answer, reason, reachable=True)
    return answer, reason


def spec_model_labels(spec: JobSpec, settings: Settings) -> ModelLabels | None:
    """The labels an evaluation or prediction job without a task_name or train_file reads its files by:
    its model's config.json (a registered model's or a job's from this machine's copy of its config and
    tokenizer files, a folder's, a Hub id's in the Hub cache), as the worker will load it. UNKNOWN when
    the API cannot read the config (a Hub id it has no copy of, the store away): the worker checks.
    None for any other job (its labels are the task's or its train_file's)."""
    if not reads_model_labels(spec):
        return None
    try:
        folder = api_model_folder(spec, settings)
    except (StoreUnavailable, FileNotFoundError, OSError):
        return UNKNOWN_MODEL_LABELS
    if folder is not None:
        return model_labels(read_config(folder / "config.json"))
    if is_registered(spec.model_name_or_path):
        return UNKNOWN_MODEL_LABELS
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(spec.model_name_or_path, "config.json", cache_dir=hub_cache_dir())
    except ValueError:  # not a valid repository id
        return UNKNOWN_MODEL_LABELS
    return model_labels(read_config(Path(found))) if isinstance(found, str) else UNKNOWN_MODEL_LABELS
