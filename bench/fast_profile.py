"""Where a fast-path training step's time goes (issue 23): MiniLM with `fast: true` on SST-2's first
rows, in this process (no API, no worker), under torch.profiler.

    python bench/fast_profile.py                  # 2000 rows (63 steps of batch 32), one thread pool
    python bench/fast_profile.py --rows 1000 --top 25 --profiled-steps 10

The run is worker.training.loop's own, with each phase of a step wrapped where it happens: fetching and
collating the batch (the data loader's `next`), the forward pass, the backward pass, the optimizer
step (clipping, AdamW, the scheduler, zero_grad) and the evaluations. It prints the seconds and the
share of each phase (wall clock, summed over the run), then the profiler's most expensive operators
by self CPU time, which say what inside the phases costs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function, schedule  # noqa: E402

from bench.harness import bench_settings, load_average, run_folder  # noqa: E402
from gluejobs_server.demo import MODEL_NAME, demo_model_folder, install_demo_files  # noqa: E402
from shared.jobspec.spec import JobSpec  # noqa: E402
from worker.training import loop as training  # noqa: E402

PHASES = ("collate", "forward", "backward", "optimizer", "eval")


class _Phases:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def timed(self, name: str) -> Any:
        phases = self

        class _Timed:
            def __enter__(self) -> None:
                self.record = record_function(name)
                self.record.__enter__()
                self.started = time.perf_counter()

            def __exit__(self, *exc: object) -> None:
                phases.seconds[name] += time.perf_counter() - self.started
                self.record.__exit__(*exc)

        return _Timed()


def _instrument(phases: _Phases, profiler: Any) -> None:
    """Wrap worker.training.loop's step, batches and evaluation in the phases' timers; each training step
    advances the profiler's schedule."""

    def train_step(run: Any, batch: dict[str, torch.Tensor], max_grad_norm: float | None) -> Any:
        accelerator = run.accelerator
        grad_norm = None
        with accelerator.accumulate(run.model):
            with phases.timed("forward"):
                loss = run.model(**batch).loss
            with phases.timed("backward"):
                accelerator.backward(loss)
            with phases.timed("optimizer"):
                if max_grad_norm is not None and accelerator.sync_gradients:
                    grad_norm = accelerator.clip_grad_norm_(run.model.parameters(), max_grad_norm)
                run.optimizer.step()
                run.lr_scheduler.step()
                run.optimizer.zero_grad()
        profiler.step()
        return loss, grad_norm

    original_batches = training.epoch_batches

    def epoch_batches(*args: Any, **kwargs: Any) -> Iterator[Any]:
        batches = iter(original_batches(*args, **kwargs))
        while True:
            with phases.timed("collate"):
                batch = next(batches, None)
            if batch is None:
                return
            yield batch

    original_evaluate = training._evaluate_all

    def evaluate_all(run: Any, *, threshold: float = 0.0) -> dict[str, float]:
        with phases.timed("eval"):
            return original_evaluate(run, threshold=threshold)

    training.train_step = train_step  # type: ignore[assignment]
    training.epoch_batches = epoch_batches  # type: ignore[assignment]
    training._evaluate_all = evaluate_all  # type: ignore[assignment]


class _Quiet:
    def log(self, message: str, *, level: str = "info", data: dict[str, Any] | None = None) -> None: ...
    def metrics(self, **row: Any) -> None: ...
    def checkpoint(self, **row: Any) -> None: ...
    def checkpoints_deleted(self, steps: list[int]) -> None: ...


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--profiled-steps", type=int, default=10)
    args = parser.parse_args()
    phases = _Phases()
    # The operators of `--profiled-steps` steps after a few to warm up: a whole run's trace takes
    # longer to summarise than to record.
    profiler = profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=3, warmup=2, active=args.profiled_steps, repeat=1),
    )
    _instrument(phases, profiler)
    with run_folder("gluejobs-fast-profile-") as root:
        settings = bench_settings(root)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        install_demo_files(settings)
        # MiniLM's files as a models-folder model (workers resolve a bare name there, not on the Hub).
        shutil.copytree(demo_model_folder(settings), settings.models_dir / MODEL_NAME)
        spec = JobSpec.model_validate(
            {
                "model_name_or_path": MODEL_NAME,
                "task_name": "sst2",
                "max_train_samples": args.rows,
                "num_train_epochs": 1,
                "max_length": 128,
                "per_device_train_batch_size": 32,
                "learning_rate": 5e-5,
                "seed": args.seed,
                "save_strategy": "no",
                "logging_steps": 10,
                "fast": True,
            }
        )
        started = time.perf_counter()
        with profiler:
            result = training.run_training(spec, settings, output_dir=root / "job", reporter=_Quiet())
        wall_s = time.perf_counter() - started
    step_s = sum(phases.seconds[name] for name in ("collate", "forward", "backward", "optimizer"))
    summary = {
        "rows": args.rows,
        "torch_threads": torch.get_num_threads(),
        "steps": result["completed_steps"],
        "train_samples_per_second": result.get("train_samples_per_second"),
        "accuracy": result["final_metrics"].get("accuracy"),
        "wall_s": round(wall_s, 1),
        "phase_s": {name: round(phases.seconds[name], 2) for name in PHASES},
        "share_of_training_steps": {
            name: round(phases.seconds[name] / step_s, 3) for name in PHASES if name != "eval"
        },
        "load_average": load_average(),
    }
    print(json.dumps(summary), flush=True)
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
