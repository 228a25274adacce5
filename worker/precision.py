"""The mixed precision a job trains in on this worker: the spec's, except where it would defeat
the reason the spec asked for it.

bf16 autocast on a CPU without bf16 instructions (AVX512-BF16 or AMX) is emulated, every operand
converted on the way in and out: a MiniLM training step (batch 32 × 32 tokens, torch 2.13) took
17.6 s in bf16 against 0.74 s in fp32 on a 2-core AVX2 EPYC, 24× as long. On a CPU that has them,
bf16 is the faster one (docs/benchmarks.md, Speed).

- `fast: true` fills in bf16 because it is faster where the CPU has it; where it has not, the fast
  job trains in fp32 and its events say why. (A spec that sets `fast` and `bf16` both is read the
  same way: the stored spec cannot tell the two apart, and fast asks for speed.)
- bf16 asked for without `fast` is honoured, with a warning of what it costs here: the user may
  need bf16's numbers (to compare with a GPU run) more than the time.
- fp16 without a GPU fails the job (there is no CPU fp16 autocast worth the name); GPUs are left
  to accelerate, which checks what the device supports.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shared.core.errors import JobFailed
from shared.jobspec.spec import JobSpec


@dataclass(frozen=True)
class Precision:
    mixed_precision: str  # accelerate's word: "no", "bf16" or "fp16"
    warning: str | None = None  # what the job's events should say about it


def cpu_has_native_bf16() -> bool:
    """Whether this CPU runs bf16 matrix products natively (AVX512-BF16 or AMX tiles). torch keeps
    the probes private (torch.cpu._is_*_supported); a torch without them is assumed to have bf16,
    which was the behaviour before this check."""
    probes = [
        getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    ]
    if not any(probes):
        return True
    return any(probe() for probe in probes if probe is not None)


def training_precision(spec: JobSpec, *, on_cuda: bool, native_bf16: bool) -> Precision:
    """The precision `spec` trains in on a worker with (`on_cuda`) or without a GPU."""
    asked = spec.mixed_precision
    if on_cuda or asked == "no":
        return Precision(asked)
    if asked == "fp16":
        raise JobFailed("fp16 needs a CUDA GPU and this worker has none; use bf16 (it also runs on CPU)")
    if native_bf16:
        return Precision("bf16")
    if spec.fast:
        return Precision(
            "no",
            "fast: training in fp32, not bf16: this CPU has no bf16 instructions (AVX512-BF16 or "
            "AMX), and emulated bf16 is many times slower than fp32 here",
        )
    return Precision(
        "bf16",
        "bf16 on a CPU without bf16 instructions (AVX512-BF16 or AMX) is emulated: expect training "
        "many times slower than fp32 (leave bf16 out, or use `fast`, which picks fp32 here)",
    )
