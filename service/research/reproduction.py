"""Did a rerun reproduce its original? Computed when a rerun is read, from the two jobs' rows.

The comparison covers every evaluation metric of every eval split at the final evaluation
(latest_metrics) and at the best one (best_metrics), and the steps they were taken at. A rerun
`matched` when every value is within ABSOLUTE_TOLERANCE of the original's, and says whether the
match was exact (bit for bit, which is what a CPU rerun with the same seed gives) or only within
the tolerance (GPU kernels that are not deterministic move the last digits). It also lists what
differs in the two attempts' reproducibility records (versions, device, data and weight hashes),
which is usually why a rerun does not match.
"""

from __future__ import annotations

from typing import Any

from shared.core.tables import Job, JobStatus
from shared.jobspec.tasks import EVAL_SPLIT

ABSOLUTE_TOLERANCE = 1e-6


def compare_runs(original: Job, rerun: Job) -> dict[str, Any]:
    base: dict[str, Any] = {"of_job": original.id, "tolerance": {"absolute": ABSOLUTE_TOLERANCE}}
    if not (original.status.is_terminal and rerun.status.is_terminal):
        return {**base, "status": "pending", "match": None}
    if original.status != JobStatus.succeeded or rerun.status != JobStatus.succeeded:
        reason = f"the original {original.status}, the rerun {rerun.status}: only succeeded runs are compared"
        return {**base, "status": "not_comparable", "match": None, "reason": reason}
    first, second = _evaluations(original), _evaluations(rerun)
    if not first and not second:
        reason = "neither run evaluated (eval_strategy 'no'): there are no metrics to compare"
        return {**base, "status": "not_comparable", "match": None, "reason": reason}
    differences: list[dict[str, Any]] = []
    largest = 0.0
    for key in sorted(set(first) | set(second)):
        a, b = first.get(key), second.get(key)
        point, split, name = key
        entry = {"evaluation": point, "split": split, "name": name, "original": a, "rerun": b}
        if a is None or b is None:
            differences.append({**entry, "difference": None})
            continue
        gap = abs(a - b)
        largest = max(largest, gap)
        if gap != 0.0:
            differences.append({**entry, "difference": gap})
    missing = any(d["difference"] is None for d in differences)
    within = not missing and largest <= ABSOLUTE_TOLERANCE
    return {
        **base,
        "status": "matched" if within else "differs",
        "match": ("exact" if not differences else "within_tolerance") if within else None,
        "compared": len(set(first) | set(second)),
        "max_abs_difference": largest,
        "differences": differences,
        "environment_differences": environment_differences(original.environment, rerun.environment),
    }


def _evaluations(job: Job) -> dict[tuple[str, str, str], float]:
    """{(final|best, split, name): value}, the steps included (as name "step")."""
    values: dict[tuple[str, str, str], float] = {}
    for split, metrics in (job.latest_metrics or {}).items():
        if split.startswith(EVAL_SPLIT):
            for name, value in metrics.items():
                if name != "epoch":
                    values[("final", split, name)] = float(value)
    best = job.best_metrics or {}
    for name, value in (best.get("metrics") or {}).items():
        values[("best", EVAL_SPLIT, name)] = float(value)
    if "step" in best:
        values[("best", EVAL_SPLIT, "step")] = float(best["step"])
    return values


def environment_differences(first: dict[str, Any] | None, second: dict[str, Any] | None) -> list[str]:
    """What changed between two reproducibility records, one line each ("torch: 2.3.0 → 2.4.0")."""
    if not first or not second:
        return [] if first == second else ["only one of the two runs has a reproducibility record"]
    lines = []
    for name in sorted(set(first.get("packages", {})) | set(second.get("packages", {}))):
        a, b = first.get("packages", {}).get(name), second.get("packages", {}).get(name)
        if a != b:
            lines.append(f"{name}: {a} → {b}")
    for key in ("python", "gluejobs_commit"):
        if first.get(key) != second.get(key):
            lines.append(f"{key}: {first.get(key)} → {second.get(key)}")
    if _device_name(first) != _device_name(second):
        lines.append(f"device: {_device_name(first)} → {_device_name(second)}")
    for kind in ("data_files", "model_files"):
        a_files, b_files = _hashes(first.get(kind)), _hashes(second.get(kind))
        for role in sorted(set(a_files) | set(b_files)):
            if a_files.get(role) != b_files.get(role):
                lines.append(
                    f"{kind.replace('_', ' ')} {role}: sha256 {a_files.get(role)} → {b_files.get(role)}"
                )
    return lines


def _device_name(record: dict[str, Any]) -> Any:
    device = record.get("device") or {}
    return device.get("gpus") or device.get("cpu")


def _hashes(files: Any) -> dict[str, Any]:
    if not isinstance(files, list):
        return {}
    return {str(f.get("role") or f.get("path")): f.get("sha256") for f in files if isinstance(f, dict)}
