"""How a run used its machine: tokens per second, padding efficiency, and model FLOP utilisation.

FLOPs (the standard estimate, Kaplan et al. 2020 and PaLM's appendix B):
- matmul FLOPs per token: 2·N forward, 2·N for the activations' gradients and 2·N_trainable for the
  weights' gradients, so 4·N + 2·N_trainable (6·N when everything trains; LoRA's frozen weights
  get no weight gradients). N counts the weights of matrix products (every parameter of two or more
  dimensions outside nn.Embedding: lookups are not matmuls; biases and norms are negligible).
- attention's own FLOPs (scores and the weighted sum, forward and backward): 12·layers·hidden per
  token per position it attends to, i.e. 12·layers·hidden·S² for a sequence of S tokens.
`model_flops` counts the real (unpadded) tokens: the useful work. `hardware_flops` counts the padded
ones: what the device computed. MFU = model_flops / train seconds / peak; HFU likewise with
hardware_flops. Evaluation is not counted.

The peak, in the run's compute precision (bf16/fp16 under mixed precision, else fp32):
- GLUEJOBS_PEAK_FLOPS (FLOP/s per process) when set: the operator's word for any device;
- a CUDA GPU: the dense peak from the table below, by the device's name;
- a CPU: measured, as the best of a few 1024×1024 matrix products in that precision on the run's
  threads. It is the rate this machine reaches now (a shared machine measures less), not the
  datasheet's, so MFU on a CPU says how close the run came to what matmuls can do here.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from worker.training.precision import cpu_has_native_bf16

# Dense (no sparsity) peak FLOP/s per GPU from NVIDIA's datasheets: (bf16/fp16 tensor cores, fp32).
# First match wins, so the longer names come before those they contain ("A100" before "A10").
GPU_PEAK_FLOPS: tuple[tuple[str, float, float], ...] = (
    ("H200", 989e12, 67e12),
    ("H100 PCIe", 756e12, 51e12),
    ("H100", 989e12, 67e12),  # SXM
    ("A100", 312e12, 19.5e12),
    ("L40S", 362e12, 91.6e12),
    ("L4", 121e12, 30.3e12),
    ("A10", 125e12, 31.2e12),
    ("V100", 125e12, 15.7e12),  # fp16 only
    ("T4", 65e12, 8.1e12),  # fp16 only
)
_MEASURE_SIZE = 1024
_MEASURE_REPEATS = 5


def matmul_parameters(model: nn.Module) -> tuple[int, int]:
    """(N, N_trainable): the weights that take part in matrix products (see the module's docstring)."""
    embedding_weights = {
        id(p) for module in model.modules() if isinstance(module, nn.Embedding) for p in module.parameters()
    }
    total = trainable = 0
    for p in model.parameters():
        if p.dim() < 2 or id(p) in embedding_weights:
            continue
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return total, trainable


def attention_shape(model: nn.Module) -> tuple[int, int] | None:
    """(layers, hidden size) from the model's config, when it names them."""
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", None)
    hidden = getattr(config, "hidden_size", None)
    if isinstance(layers, int) and isinstance(hidden, int):
        return layers, hidden
    return None


def training_flops(model: nn.Module, *, tokens: int, squared_lengths: int) -> float:
    """FLOPs of training on `tokens` tokens whose sequences' squared lengths sum to `squared_lengths`."""
    total, trainable = matmul_parameters(model)
    flops = (4 * total + 2 * trainable) * tokens
    shape = attention_shape(model)
    if shape is not None:
        layers, hidden = shape
        flops += 12 * layers * hidden * squared_lengths
    return float(flops)


def peak_flops(
    device: torch.device, mixed_precision: str, configured: float | None
) -> tuple[float | None, str]:
    """The device's peak FLOP/s in the run's precision, and where the figure comes from."""
    if configured:
        return configured, "GLUEJOBS_PEAK_FLOPS"
    low_precision = mixed_precision in ("bf16", "fp16")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for pattern, tensor_peak, fp32_peak in GPU_PEAK_FLOPS:
            if pattern in name:
                kind = mixed_precision if low_precision else "fp32"
                return (tensor_peak if low_precision else fp32_peak), f"datasheet: {name}, dense {kind}"
        return None, f"unknown GPU {name!r}: set GLUEJOBS_PEAK_FLOPS"
    if device.type == "cpu":
        # Emulated bf16 (no AVX512-BF16/AMX) multiplies at a hundredth of fp32's rate (0.83 against
        # 113 GFLOP/s on an AVX2 EPYC), and measuring it took 16 s: there the fp32 rate, what the
        # hardware can do, is the peak.
        bf16 = mixed_precision == "bf16" and cpu_has_native_bf16()
        dtype = torch.bfloat16 if bf16 else torch.float32
        emulated = " (this CPU has no bf16 instructions)" if mixed_precision == "bf16" and not bf16 else ""
        return measure_matmul_flops(dtype), (
            f"measured: best of {_MEASURE_REPEATS} {_MEASURE_SIZE}×{_MEASURE_SIZE} "
            f"{str(dtype).removeprefix('torch.')} matmuls on {torch.get_num_threads()} threads{emulated}"
        )
    return None, f"no peak known for {device.type}: set GLUEJOBS_PEAK_FLOPS"


def measure_matmul_flops(dtype: torch.dtype, size: int = _MEASURE_SIZE) -> float:
    """The best FLOP/s of a few square matrix products on the CPU (about a tenth of a second)."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)  # warm-up: the first call picks and primes its kernel
    best = float("inf")
    for _ in range(_MEASURE_REPEATS):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


def summary(
    model: nn.Module,
    *,
    seconds: float,
    real_tokens: int,
    padded_tokens: int,
    real_squared: int,
    padded_squared: int,
    peak: float | None,
    peak_source: str,
    num_processes: int,
) -> dict[str, Any]:
    """The result's throughput fields. Token counts are summed over processes; the peak is per
    process (device), so utilisation divides by peak × processes."""
    seconds = max(seconds, 1e-9)
    model_flops = training_flops(model, tokens=real_tokens, squared_lengths=real_squared)
    hardware_flops = training_flops(model, tokens=padded_tokens, squared_lengths=padded_squared)
    fields: dict[str, Any] = {
        "real_tokens_per_second": round(real_tokens / seconds, 1),
        "padded_tokens_per_second": round(padded_tokens / seconds, 1),
        "padding_efficiency": round(real_tokens / padded_tokens, 4) if padded_tokens else None,
        "model_flops": model_flops,
        "hardware_flops": hardware_flops,
        "model_flops_per_second": round(model_flops / seconds, 1),
        "peak_flops": peak,
        "peak_flops_source": peak_source,
        "mfu": None,
        "hfu": None,
    }
    if peak:
        fields["mfu"] = _significant(model_flops / seconds / (peak * num_processes))
        fields["hfu"] = _significant(hardware_flops / seconds / (peak * num_processes))
    return fields


def _significant(value: float, digits: int = 4) -> float:
    return float(f"{value:.{digits}g}")
