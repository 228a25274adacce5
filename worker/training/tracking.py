"""Experiment trackers (with_tracking / report_to) through Accelerate's trackers.

As in run_glue_no_trainer.py: `Accelerator(log_with=..., project_dir=...)`, `init_trackers` with the
run's configuration, `accelerator.log` of each training and evaluation row, `end_training`.

A tracker never writes outside the job's folder:
- TensorBoard's event files land in `<job>/tensorboard/` (the project folder is the job's folder);
- MLflow reports to its own configuration when the worker has one (MLFLOW_TRACKING_URI: a tracking
  server); without it, MLflow 3 would create `mlflow.db` in the worker's working directory, so the
  job's run goes to `<job>/mlflow/mlflow.db` instead. Its telemetry, which keeps an installation id
  in ~/.config/mlflow, is turned off.
The other trackers Accelerate knows write to the working directory or the home folder in ways
gluejobs has not pinned and tested (wandb, aim, dvclive, swanlab, trackio, comet_ml, clearml): they
are refused, by GLUEJOBS_TRACKERS' check at start-up and here.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from accelerate.utils import ProjectConfiguration

from shared.core.config import CONFINED_TRACKERS
from shared.core.errors import JobFailed
from shared.jobspec.spec import JobSpec

PROJECT_NAME = "gluejobs"  # the MLflow experiment (MLFLOW_EXPERIMENT_NAME overrides it) and TensorBoard run
TENSORBOARD_DIR = "tensorboard"
MLFLOW_DIR = "mlflow"
# The package each tracker needs on the worker, and what to install for it.
_PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "mlflow": ("mlflow", "mlflow-skinny"),
    "wandb": ("wandb", "wandb"),
    "trackio": ("trackio", "trackio"),
    "comet_ml": ("comet_ml", "comet-ml"),
    "aim": ("aim", "aim"),
    "clearml": ("clearml", "clearml"),
    "dvclive": ("dvclive", "dvclive"),
    "swanlab": ("swanlab", "swanlab"),
}


def trackers_for(spec: JobSpec, output_dir: Path) -> list[str]:
    """The trackers a run reports to, each checked to be installed here and kept inside `output_dir`.

    Accelerate silently drops a tracker whose package is missing; a job that asked for it must
    fail instead, naming it. "all" (the script's default, kept when a spec was not resolved by the
    API) means every tracker installed on this worker that gluejobs keeps in the job's folder.
    """
    wanted = spec.trackers
    if wanted == ["all"]:
        wanted = [name for name in CONFINED_TRACKERS if _installed(_PACKAGES[name][0])]
    for name in wanted:
        module, package = _PACKAGES[name]
        if not _installed(module):
            raise JobFailed(
                f"tracker {name!r} is not installed on this worker (pip install {package}); "
                "GLUEJOBS_TRACKERS should name only the trackers every worker serves",
                field="report_to",
            )
        if name not in CONFINED_TRACKERS:
            raise JobFailed(
                f"tracker {name!r} would write outside the job's folder; gluejobs serves "
                f"{', '.join(CONFINED_TRACKERS)}",
                field="report_to",
            )
    if "mlflow" in wanted:
        _keep_mlflow_in(output_dir)
    return wanted


def _keep_mlflow_in(output_dir: Path) -> None:
    """MLflow's defaults point at the working directory and the home folder: point them at the job's."""
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"  # this process is the job's own: nothing else sees it
    if not os.environ.get("MLFLOW_TRACKING_URI"):
        folder = output_dir / MLFLOW_DIR
        folder.mkdir(parents=True, exist_ok=True)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def project_configuration(output_dir: Path) -> ProjectConfiguration:
    return ProjectConfiguration(project_dir=str(output_dir), logging_dir=str(output_dir / TENSORBOARD_DIR))


def init_kwargs(output_dir: Path) -> dict[str, dict[str, Any]]:
    return {"mlflow": {"run_name": f"job {output_dir.name}"}}


def tracker_config(spec: JobSpec) -> dict[str, Any]:
    """The spec as hyperparameters: TensorBoard takes only scalars and strings, so lists are joined."""
    values: dict[str, Any] = {}
    for name, value in spec.model_dump(mode="json").items():
        values[name] = ",".join(map(str, value)) if isinstance(value, list) else value
    return values


def tracker_values(split: str, values: dict[str, float]) -> dict[str, float]:
    """Row names as Trainer's TensorBoard tags: `train/loss`, `eval/accuracy`, `eval_mismatched/…`."""
    return {f"{split}/{name}": value for name, value in values.items()}
