"""Dropout whose masks NumPy's PCG64 generator draws (the spec's `fast_dropout`, part of `fast`), on
the CPU.

Why our own: torch draws a CPU dropout mask element by element from its mt19937 generator, on one
thread. On a 2-core Emerald Rapids Xeon (torch 2.13) a MiniLM fast-path step spent 12% of its time
in `bernoulli_` (a 32×16×384 mask: 1.9 ms), while NumPy's PCG64 fills the same mask in 0.85 ms.
The masks have the same law: each element kept with probability 1 − p (p to 2⁻²⁴, the resolution
of a float32 draw), the kept ones scaled by 1/(1 − p); only the random stream differs from torch's.
No maintained library offers a faster eager CPU dropout; torch.compile generates one, but compiling
MiniLM took 195 s cold on the same machine and its steps were slower (docs/benchmarks.md, Speed).

Not on CUDA: there torch's dropout draws in the kernel, and a mask made on the host would cost a
copy. Attention-probability dropout inside scaled_dot_product_attention stays torch's (the model
passes a probability, not a module).

Determinism: a step's masks follow from (seed, process, optimizer step) — `at_step` before each
forward — so a run resumed from a checkpoint draws the masks the uninterrupted run drew.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from torch import nn

from worker.training.reporter import MainProcessReporter


class MaskSource:
    """The generator the swapped dropout layers share, re-seeded at each optimizer step."""

    def __init__(self, seed: int, process_index: int) -> None:
        self._key = (seed, process_index)
        self._step: int | None = None
        self._rng = np.random.default_rng(self._key)

    def at_step(self, step: int) -> None:
        """Draw this optimizer step's masks (every micro-batch of it, in order) from its own stream."""
        if step != self._step:
            self._step = step
            self._rng = np.random.default_rng((*self._key, step))

    def keep(self, shape: torch.Size, p: float) -> torch.Tensor:
        """A boolean mask of `shape`: True with probability 1 − p."""
        draws = self._rng.random(int(np.prod(shape, dtype=np.int64)), dtype=np.float32)
        return torch.from_numpy(draws >= np.float32(p)).view(shape)


class _ScaledMask(torch.autograd.Function):
    """x · mask / (1 − p), and the same factor on the way back (what torch's dropout computes)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        factor = keep.to(x.dtype).mul_(scale)
        ctx.save_for_backward(factor)
        return x * factor

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (factor,) = ctx.saved_tensors
        return grad * factor, None, None


class PcgDropout(nn.Dropout):
    """nn.Dropout with MaskSource's masks; in eval mode, and at p = 0, the identity as before."""

    def __init__(self, p: float, source: MaskSource) -> None:
        super().__init__(p)
        self.source = source

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.p == 1.0:
            return x * 0.0
        return _ScaledMask.apply(x, self.source.keep(x.shape, self.p), 1.0 / (1.0 - self.p))


def install(model: nn.Module, *, seed: int, process_index: int) -> tuple[MaskSource, int]:
    """Swap every nn.Dropout of `model` for a PcgDropout of the same p; the shared source and how many
    layers were swapped. Other dropout classes (DeBERTa's StableDropout) are left as they are."""
    source = MaskSource(seed, process_index)
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:  # exactly: a subclass may do more than drop
                setattr(parent, name, PcgDropout(child.p, source))
                swapped += 1
    return source, swapped


def for_job(
    model: nn.Module, asked: bool, accelerator: Accelerator, *, seed: int, report: MainProcessReporter
) -> MaskSource | None:
    """The job's mask source when its spec asks for fast_dropout and it trains on the CPU (the
    model's dropout layers swapped); None otherwise, with a warning where it was asked for."""
    if not asked:
        return None
    device = accelerator.device.type
    if device != "cpu":
        report.log(
            f"fast_dropout applies on the CPU only: torch's dropout is kept on {device}, where it draws "
            "its masks in the kernel",
            level="warning",
        )
        return None
    source, swapped = install(model, seed=seed, process_index=accelerator.process_index)
    report.log(f"fast_dropout: {swapped} dropout layers draw their masks from NumPy's PCG64")
    return source
