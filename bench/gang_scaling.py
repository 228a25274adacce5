"""Two-machine scaling of a gang's launch (issue 37): the command each machine of a gang runs
(worker/fleet/launch.py gang_command: accelerate launch, Accelerate's static rendezvous at rank 0's address
and port), timed on a small data-parallel training loop, and its loss rows compared with one machine
running the same number of processes at the same global batch and seed.

It measures the launch and torch.distributed across machines, not the service's gang claim, which
no worker uses yet (jobs of several machines are refused by the API until the whole path works).

Here (one box, CPU, gloo), both "machines" run on loopback, rank 0 advertising 127.0.0.2:

    python bench/gang_scaling.py local --steps 20

prints one JSON line per layout (one machine × 2 processes, two machines × 1 process): wall time,
the loop's seconds per step, and whether the loss rows agree (max absolute difference).

On a GPU fleet (NCCL), on each of two machines with G GPUs, rank 0's address reachable from the other:

    python bench/gang_scaling.py member --rank R --machines 2 --processes G --address ADDR --port 29500
    python bench/gang_scaling.py member --rank 0 --machines 1 --processes G --address 127.0.0.1 --port 29500

and compare rank 0's lines (samples per second at the same per-device batch). This project's lent
device is one machine with one GPU: the two-machine run cannot be done there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
TRAIN_ENV = "GANG_BENCH_TRAIN"  # JSON of the loop's settings, for the launched processes


def train() -> None:
    """The launched processes' loop: a seeded MLP regression over seeded rows, a fixed global batch."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    settings = json.loads(os.environ[TRAIN_ENV])
    cuda = torch.cuda.is_available()
    accelerator = Accelerator(cpu=not cuda)
    set_seed(settings["seed"])
    width = settings["width"]
    rows = settings["global_batch"] * settings["steps"]
    generator = torch.Generator().manual_seed(settings["seed"])
    inputs = torch.randn(rows, width, generator=generator)
    targets = inputs[:, :1] * 0.5 - inputs[:, 1:2]
    per_device = settings["global_batch"] // accelerator.num_processes
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(inputs, targets), batch_size=per_device, shuffle=False
    )
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses, started = [], None
    for step, (x, y) in enumerate(loader):
        if step == 1:
            accelerator.wait_for_everyone()
            started = time.perf_counter()  # the first step (NCCL/gloo warm-up) is not timed
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        timed = len(losses) - 1
        elapsed = time.perf_counter() - (started or time.perf_counter())
        line = {
            "world": accelerator.num_processes,
            "device": "cuda" if cuda else "cpu",
            "s_per_step": round(elapsed / max(timed, 1), 5),
            "samples_per_s": round(settings["global_batch"] * timed / elapsed, 1) if elapsed else None,
            "losses": losses,
        }
        sys.stdout.write("GANG_BENCH " + json.dumps(line) + "\n")
        sys.stdout.flush()
    accelerator.end_training()


def _launch(
    rank: int, machines: int, processes: int, address: str, port: int, settings: dict
) -> subprocess.Popen:
    from shared.core.tables import Job
    from worker.fleet.launch import MachineRank, gang_command

    job = Job(id=0, attempts=1, num_processes=processes, spec={})
    command = gang_command(
        job,
        claim_worker_id="bench",
        machine=MachineRank(rank=rank, machines=machines, address=address, port=port),
        module="bench.gang_scaling",
    )
    env = {**os.environ, TRAIN_ENV: json.dumps(settings), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _result(outputs: list[str]) -> dict:
    for output in outputs:
        for line in output.splitlines():
            if line.startswith("GANG_BENCH "):
                return dict(json.loads(line.split(" ", 1)[1]))
    raise SystemExit("no result line:\n" + "\n".join(output[-2000:] for output in outputs))


def _run(layout: list[int], machines: int, processes: int, address: str, settings: dict) -> dict:
    from worker.fleet.launch import reserve_port

    held = reserve_port(address)
    port = int(held.getsockname()[1])
    held.close()
    started = time.perf_counter()
    launches = [_launch(rank, machines, processes, address, port, settings) for rank in layout]
    outputs = [launch.communicate(timeout=600)[0] for launch in launches]
    if any(launch.returncode for launch in launches):
        raise SystemExit("a launch failed:\n" + "\n".join(output[-3000:] for output in outputs))
    return {**_result(outputs), "wall_s": round(time.perf_counter() - started, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=["local", "member"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--machines", type=int, default=2)
    parser.add_argument("--processes", type=int, default=1, help="processes per machine")
    parser.add_argument("--address", default="127.0.0.2")
    parser.add_argument("--port", type=int, default=29500)
    args = parser.parse_args()
    settings = {
        "steps": args.steps,
        "global_batch": args.global_batch,
        "width": args.width,
        "seed": args.seed,
    }
    if args.mode == "member":
        launch = _launch(args.rank, args.machines, args.processes, args.address, args.port, settings)
        output = launch.communicate()[0]
        sys.stdout.write(output)
        raise SystemExit(launch.returncode)
    one = _run([0], 1, 2, "127.0.0.1", settings)
    two = _run([0, 1], 2, 1, args.address, settings)
    difference = max(abs(a - b) for a, b in zip(one["losses"], two["losses"], strict=True))
    for name, result in (("1 machine x 2 processes", one), ("2 machines x 1 process", two)):
        shown = {key: value for key, value in result.items() if key != "losses"}
        sys.stdout.write(json.dumps({"layout": name, **shown, "final_loss": result["losses"][-1]}) + "\n")
    sys.stdout.write(
        json.dumps({"loss_rows": len(one["losses"]), "max_abs_loss_difference": difference}) + "\n"
    )


if __name__ == "__main__":
    if TRAIN_ENV in os.environ:
        train()
    else:
        main()
