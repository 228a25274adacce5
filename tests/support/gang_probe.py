"""A stand-in for worker.fleet.child in test_gang_launch.py: joins the launch's process group the way
a job's training does (Accelerator, forced onto the CPU as worker/training/loop.py does without a GPU),
sums its global rank + 1 over every process, and prints what it saw."""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.distributed as dist
from accelerate import Accelerator


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--job-id", "--worker-id", "--attempt"):
        parser.add_argument(name)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True)
    total = accelerator.reduce(torch.tensor([float(accelerator.process_index + 1)]), "sum")
    seen = {
        "rank": accelerator.process_index,
        "world": accelerator.num_processes,
        "main": accelerator.is_main_process,
        "sum": total.item(),
        "backend": dist.get_backend(),
        "claim": [args.job_id, args.worker_id, args.attempt],
    }
    sys.stdout.write("PROBE " + json.dumps(seen) + "\n")
    sys.stdout.flush()
    accelerator.end_training()


if __name__ == "__main__":
    main()
