"""What a training run cost: samples, tokens and seconds (Meter, for the job's speed figures and
worker/training/throughput.py's MFU), and the running loss between two logged training rows (LossWindow)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator

from worker.training import throughput


class Meter:
    """What the training cost: samples, tokens and seconds, counted beside the loop (Trainer's
    speed metrics, plus what worker/training/throughput.py needs for MFU). Evaluation and saving are paused
    out of the training time."""

    def __init__(self, accelerator: Accelerator) -> None:
        self._accelerator = accelerator
        self._processes = accelerator.num_processes
        self.train_seconds = 0.0
        # This process's CPU time (all its threads) over the same span: what the training cost the
        # machine, which other work on shared cores does not inflate the way it inflates wall time.
        self.train_cpu_seconds = 0.0
        self.eval_seconds = 0.0
        self.train_samples = 0
        self.padded_tokens = 0
        self.real_tokens = 0
        # Sums of each sequence's squared length (padded, real): attention's FLOPs (throughput.py).
        self.padded_squared = 0
        self.real_squared = 0
        # Summed on the device during an epoch: no host sync per step (read once, after the epoch).
        self._real_tokens = torch.zeros((), dtype=torch.long, device=accelerator.device)
        self._real_squared = torch.zeros((), dtype=torch.long, device=accelerator.device)
        self._started = self._started_cpu = 0.0

    @contextmanager
    def training(self) -> Iterator[None]:
        """One epoch's training: its time, and its real tokens gathered from every process once it
        ends (a collective: it runs only when every process finishes the epoch normally)."""
        self._real_tokens.zero_()
        self._real_squared.zero_()
        self._started, self._started_cpu = time.perf_counter(), time.process_time()
        yield
        self.train_seconds += time.perf_counter() - self._started
        self.train_cpu_seconds += time.process_time() - self._started_cpu
        self.real_tokens += int(self._accelerator.reduce(self._real_tokens, reduction="sum").item())
        self.real_squared += int(self._accelerator.reduce(self._real_squared, reduction="sum").item())

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent in here (evaluating, saving) is not training time."""
        paused, paused_cpu = time.perf_counter(), time.process_time()
        yield
        self._started += time.perf_counter() - paused
        self._started_cpu += time.process_time() - paused_cpu

    def count(self, batch: dict[str, torch.Tensor]) -> None:
        """A training batch of this process (every process trains on a batch of the same shape)."""
        rows, width = batch["input_ids"].shape
        self.train_samples += rows * self._processes
        self.padded_tokens += rows * width * self._processes
        self.padded_squared += rows * width * width * self._processes
        lengths = batch["attention_mask"].sum(dim=1)
        self._real_tokens += lengths.sum()
        self._real_squared += (lengths * lengths).sum()

    def summary(self, model: Any, peak_flops: float | None) -> dict[str, Any]:
        """The run's speed figures (for the job's `result`)."""
        accelerator = self._accelerator
        peak, peak_source = throughput.peak_flops(accelerator.device, accelerator.mixed_precision, peak_flops)
        usage = throughput.summary(
            model,
            seconds=self.train_seconds,
            real_tokens=self.real_tokens,
            padded_tokens=self.padded_tokens,
            real_squared=self.real_squared,
            padded_squared=self.padded_squared,
            peak=peak,
            peak_source=peak_source,
            num_processes=self._processes,
        )
        return {
            "train_samples": self.train_samples,
            "train_runtime_s": round(self.train_seconds, 3),
            "train_samples_per_second": round(self.train_samples / max(self.train_seconds, 1e-9), 3),
            # The main process's CPU seconds (per process: several processes each spend about as much).
            "train_cpu_s": round(self.train_cpu_seconds, 3),
            "train_samples_per_cpu_second": round(
                self.train_samples / self._processes / max(self.train_cpu_seconds, 1e-9), 3
            ),
            "padded_tokens": self.padded_tokens,
            "real_tokens": self.real_tokens,
            **usage,
            "eval_runtime_s": round(self.eval_seconds, 3),
        }


@dataclass
class LossWindow:
    """The training rows' window: the mean loss over the batches since the last row."""

    loss: torch.Tensor
    batches: int = 0
    # The last optimizer step's, before clipping (as Trainer logs it); a tensor, read only when a row
    # is logged, so that clipping costs no host sync per step on a GPU.
    grad_norm: torch.Tensor | None = None

    def add(self, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> None:
        self.loss += loss.detach().float()
        self.batches += 1
        if grad_norm is not None:
            self.grad_norm = grad_norm

    def reset(self) -> None:
        self.loss.zero_()
        self.batches = 0
