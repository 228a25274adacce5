"""A run's checkpoints: every process saves its part into a staging folder, the main process
publishes it and hands it to the uploads (worker/training/checkpoint_uploads.py), which declare it once it is
in the store; a resumed run loads one back. Each checkpoint is also a model (`save_pretrained`'s
files and the tokenizer), as Trainer's are. The folders themselves: worker/training/checkpoints.py."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from transformers import PreTrainedTokenizerBase

from worker.training import checkpoints
from worker.training.checkpoint_uploads import CheckpointUploads, SavedCheckpoint
from worker.training.job_storage import JobStorage
from worker.training.modeling import load_model_files, save_model_files
from worker.training.progress import Progress
from worker.training.reporter import MainProcessReporter


def keep_model_files_in_checkpoints(accelerator: Accelerator, tokenizer: PreTrainedTokenizerBase) -> None:
    """Make every checkpoint a model: `save_state` hands its model to these hooks, which write it
    with `save_pretrained` (the adapter, for LoRA) beside the tokenizer, and `load_state` reads it
    back from there. Accelerate then writes the optimizer, scheduler and RNG states only, and no
    second copy of the weights."""

    def save(models: list[Any], weights: list[Any], folder: str) -> None:
        if accelerator.is_main_process:
            save_model_files(accelerator.unwrap_model(models[0]), tokenizer, Path(folder))
        weights.pop(0)

    def load(models: list[Any], folder: str) -> None:
        load_model_files(accelerator.unwrap_model(models.pop(0)), Path(folder))

    accelerator.register_save_state_pre_hook(save)
    accelerator.register_load_state_pre_hook(load)


class RunCheckpoints:
    """Saves, declares (once uploaded) and loads the checkpoints of one run."""

    def __init__(
        self,
        accelerator: Accelerator,
        storage: JobStorage,
        progress: Progress,
        report: MainProcessReporter,
        *,
        keep: int | None,
        check_room: Callable[[Path], None] = lambda folder: None,
    ) -> None:
        self._accelerator = accelerator
        self._check_room = check_room  # worker/disk_space.check_room: the floor, before a save
        self._storage = storage
        self._progress = progress
        self._report = report
        self._keep = keep  # save_total_limit
        self.folder = storage.local / "checkpoints"
        self.uploads = CheckpointUploads(storage, self._declare)

    def path(self, step: int) -> Path:
        return checkpoints.checkpoint_path(self.folder, step)

    def save(self, metrics: dict[str, float]) -> None:
        """Save the current step (once), with the metrics of its evaluation, if any."""
        accelerator, progress = self._accelerator, self._progress
        step = progress.completed_steps
        if progress.last_save_step == step:
            return
        final = self.path(step)
        # Below the worker's free-space floor the attempt ends here as no_space (handed back, no attempt
        # spent), not halfway through a write with a library's words for a short write.
        self._check_room(self.folder)
        staging = checkpoints.staging_path(final)
        staging.mkdir(parents=True, exist_ok=True)  # every rank writes into it; none may find it missing
        accelerator.wait_for_everyone()
        accelerator.save_state(str(staging))  # every process writes its part (optimizer shards, RNG)
        accelerator.wait_for_everyone()  # all parts are written before the folder is renamed
        if accelerator.is_main_process:
            progress.state().write(staging)
            checkpoints.publish(staging, final)
        accelerator.wait_for_everyone()
        progress.last_save_step = step
        is_best = bool(metrics) and progress.best_step == step
        if accelerator.is_main_process:
            # Uploaded beside the next steps, declared once it is in the store (checkpoint_uploads.py).
            self.uploads.submit(SavedCheckpoint(step, progress.epoch, final, metrics, is_best))
        else:
            # On another machine of a gang (issue 37) this machine's processes wrote their parts (RNG
            # states) into a staging folder of their own that nothing publishes: it goes. Rank 0's
            # checkpoint is the one that counts; a resume on a new gang seeds these processes afresh
            # (Accelerate skips a missing RNG state). With one disk the folder was published: no-op.
            shutil.rmtree(staging, ignore_errors=True)
        accelerator.wait_for_everyone()

    def _declare(self, saved: SavedCheckpoint) -> None:
        """Write a checkpoint's row (it is in the store), then rotate: the main process, training thread."""
        path = self._storage.checkpoint_location(saved.folder)
        self._report.checkpoint(
            step=saved.step, epoch=saved.epoch, path=path, metrics=saved.metrics, is_best=saved.is_best
        )
        deleted = self._storage.rotate(keep=self._keep, best_step=self._progress.best_step)
        if deleted:
            self._report.checkpoints_deleted(deleted)
        # Once in the store, older local copies only hold the disk (load_best fetches one back).
        self._storage.prune_local(saved.step)

    def resume(self, folder: Path, *, accumulation: int) -> tuple[int, int]:
        """Load a checkpoint; the epoch to start in and the batches of it already done."""
        self._accelerator.load_state(str(folder))
        progress = self._progress
        progress.restore(checkpoints.TrainingState.read(folder))
        self._report.log(
            f"resumed from {folder.name} at step {progress.completed_steps}",
            data={"checkpoint": folder.name, "step": progress.completed_steps},
        )
        epoch, steps_into_epoch = divmod(progress.completed_steps, progress.steps_per_epoch)
        return epoch, steps_into_epoch * accumulation

    def load_best(self) -> None:
        """Load the best checkpoint's weights (a resumed attempt's may be in the store only)."""
        step = self._progress.best_step
        assert step is not None
        if self._accelerator.is_local_main_process:  # each machine of a gang fetches its own copy
            self._storage.local_checkpoint(step)
        self._accelerator.wait_for_everyone()
        self._accelerator.load_state(str(self.path(step)))
