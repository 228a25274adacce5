"""A worker reads models from GLUEJOBS_MODELS_DIR or the Hugging Face Hub cache, never from a folder
that happens to sit in its working directory under a Hub id's name (transformers would try that
folder first if it were handed the id).

The worker side runs as a real process whose working directory holds the decoys, offline
(HF_HUB_OFFLINE=1) with a Hub cache of its own.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from shared.core.config import Settings
from tests.support.e2e import run_python
from worker.fleet.runner import child_environment

# A Hub id whose files are in the Hub cache; another that is not. Both also exist as decoys in cwd.
CACHED = "cached-org/cached-model"
UNCACHED = "decoy-org/decoy-model"
COMMIT = "0123456789abcdef0123456789abcdef01234567"

_RESOLVE = """
import json, sys
from transformers import AutoConfig
from shared.core.config import Settings
from worker.training.modeling import ModelError, resolve_model

settings = Settings()
answers = {}
for name in sys.argv[1:]:
    try:
        path = resolve_model(name, settings)
        answers[name] = {"path": path, "hidden_size": AutoConfig.from_pretrained(path).hidden_size}
    except ModelError as exc:
        answers[name] = {"error": exc.message}
print(json.dumps(answers))
"""


def _decoy(folder: Path, source: Path) -> None:
    """A loadable model whose configuration gives it away (hidden_size 999)."""
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 999}))


def _cache(hub_cache: Path, repo_id: str, source: Path) -> Path:
    """`repo_id` in huggingface_hub's cache layout, as a download would have left it."""
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(source, snapshot)
    return snapshot


@pytest.mark.e2e  # a process of its own, as a worker starts it
def test_a_worker_never_loads_a_model_from_its_working_directory(
    settings_factory: Any, sqlite_url: str, models_dir: Path, tmp_path: Path
) -> None:
    tiny = models_dir / "tiny-bert"
    cwd = tmp_path / "worker-cwd"
    for name in (CACHED, UNCACHED, "tiny-bert"):
        _decoy(cwd / name, tiny)
    hub_cache = tmp_path / "hub"
    snapshot = _cache(hub_cache, CACHED, tiny)
    settings: Settings = settings_factory(sqlite_url)
    env = {**child_environment(settings), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache)}
    bad = ["decoy-org//decoy-model", "decoy-org/..", "./decoy-org/decoy-model", "../worker-cwd/tiny-bert"]

    output = run_python(_RESOLVE, CACHED, UNCACHED, "tiny-bert", *bad, cwd=cwd, env=env)

    answers = json.loads(output.splitlines()[-1])
    # From the Hub cache, by absolute path: the real model, not the decoy beside the worker.
    assert answers[CACHED] == {"path": str(snapshot.resolve()), "hidden_size": 32}
    # Not in the cache and the Hub offline: a clear failure, not the decoy.
    assert (
        "neither a folder under GLUEJOBS_MODELS_DIR nor available from the Hugging Face Hub"
        in (answers[UNCACHED]["error"])
    )
    # A folder under GLUEJOBS_MODELS_DIR wins over the decoy of the same name.
    assert answers["tiny-bert"] == {"path": str(tiny.resolve()), "hidden_size": 32}
    # The API's rule, applied again by the worker to a stored spec.
    assert "empty component" in answers["decoy-org//decoy-model"]["error"]
    for name in bad[1:]:
        assert "'.' or '..' component" in answers[name]["error"], answers[name]
