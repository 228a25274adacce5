"""Experiment trackers (with_tracking / report_to) through Accelerate's trackers.

As in run_glue_no_trainer.py: `Accelerator(log_with=..., project_dir=...)`, `init_trackers` with the
run's configuration, `accelerator.log` of each training and evaluation row, `end_training`. The
project folder is the job's folder, so TensorBoard's event files land in `<job>/tensorboard/`;
MLflow reports to its own configuration (MLFLOW_TRACKING_URI and friends on the worker).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from accelerate.utils import ProjectConfiguration

from shared.errors import JobFailed
from shared.spec import JobSpec

PROJECT_NAME = "gluejobs"  # the MLflow experiment (MLFLOW_EXPERIMENT_NAME overrides it) and TensorBoard run
TENSORBOARD_DIR = "tensorboard"
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


def trackers_for(spec: JobSpec) -> list[str]:
    """The trackers a run reports to, each checked to be installed here.

    Accelerate silently drops a tracker whose package is missing; a job that asked for it must
    fail instead, naming it. "all" (the script's default, kept when a spec was not resolved by the
    API) means every tracker installed on this worker.
    """
    wanted = spec.trackers
    if wanted == ["all"]:
        return [name for name, (module, _) in _PACKAGES.items() if _installed(module)]
    for name in wanted:
        module, package = _PACKAGES[name]
        if not _installed(module):
            raise JobFailed(
                f"tracker {name!r} is not installed on this worker (pip install {package}); "
                "GLUEJOBS_TRACKERS should name only the trackers every worker serves",
                field="report_to",
            )
    return wanted


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
