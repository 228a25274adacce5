"""The mixed precision a job trains in on this worker: the spec's, except where it would defeat
the reason the spec asked for it.

bf16 on a device without bf16 units is emulated, every operand converted on the way in and out. On
a CPU without AVX512-BF16 or AMX a MiniLM training step (batch 32 × 32 tokens, torch 2.13) took
17.6 s in bf16 autocast against 0.74 s in fp32 on a 2-core AVX2 EPYC, 24× as long; GPUs before
Ampere (T4, V100) emulate it too. Where the units exist, bf16 is the faster one (docs/benchmarks.md,
Speed).

- `fast: true` fills in bf16 because it is faster where the device has it; where it has not, the
  fast job trains in fp32 and its events say why. A spec that sets `fast` and `bf16` both is read
  the same way (the stored spec cannot tell the two apart, and `fast` asks for speed): leave `fast`
  out to have bf16 whatever it costs.
- bf16 asked for without `fast` is honoured, with a warning of what it costs here: the user may
  need bf16's numbers (to compare with another run) more than the time.
- fp16 on the CPU fails the job (no CPU fp16 autocast worth the name).

The CPU probes are torch's own (torch.cpu._is_avx512_bf16_supported, _is_amx_tile_supported); they
are private and know x86 only, so on other CPUs (Arm's bf16 is the norm there) and on a torch
without them, bf16 counts as native: the behaviour from before this check.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

import torch

from shared.core.errors import JobFailed
from shared.jobspec.spec import JobSpec

CPU = "cpu"
CUDA = "cuda"
OTHER = "other"  # MPS, XPU …: accelerate's to check
_NO_BF16 = {
    CPU: "this CPU has no bf16 instructions (AVX512-BF16 or AMX)",
    CUDA: "this GPU has no bf16 units (it predates Ampere)",
}


@dataclass(frozen=True)
class Precision:
    mixed_precision: str  # accelerate's word: "no", "bf16" or "fp16"
    warning: str | None = None  # what the job's events should say about it


def training_device() -> str:
    """Where accelerate will put the job: CUDA, another accelerator, or the CPU."""
    if torch.cuda.is_available():
        return CUDA
    mps = getattr(torch.backends, "mps", None)
    xpu = getattr(torch, "xpu", None)
    if (mps is not None and mps.is_available()) or (xpu is not None and xpu.is_available()):
        return OTHER
    return CPU


def has_native_bf16(device: str) -> bool:
    if device == CUDA:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    if device == CPU:
        return cpu_has_native_bf16()
    return True


def cpu_has_native_bf16() -> bool:
    """Whether this CPU runs bf16 matrix products natively (x86: AVX512-BF16 or AMX tiles)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return True
    names = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    probes = [getattr(torch.cpu, name, None) for name in names]
    if not any(probes):
        return True
    return any(probe() for probe in probes if probe is not None)


def training_precision(spec: JobSpec, *, device: str, native_bf16: bool) -> Precision:
    """The precision `spec` trains in on `device` (CPU, CUDA or OTHER)."""
    asked = spec.mixed_precision
    if asked == "fp16" and device == CPU:
        raise JobFailed("fp16 needs a CUDA GPU and this worker has none; use bf16 (it also runs on CPU)")
    if asked != "bf16" or native_bf16 or device not in _NO_BF16:
        return Precision(asked)
    reason = _NO_BF16[device]
    if spec.fast:
        return Precision(
            "no", f"fast: training in fp32, not bf16: {reason}, and emulated bf16 is many times slower"
        )
    return Precision(
        "bf16",
        f"bf16 is emulated here ({reason}): expect training many times slower than fp32 "
        "(leave bf16 out, or use `fast`, which picks fp32 here)",
    )
