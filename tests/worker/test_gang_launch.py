"""Issue 37, third layer: what each machine of a gang launches. Two `accelerate launch` commands from
worker/fleet/launch.py's gang_command, as two machines would run them (rank 0 advertising 127.0.0.2, a
separate loopback address), form one process group over gloo; global rank 0 alone is the main
process; both carry rank 0's claim; and the reserved port is free again once they exit."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from shared.core.tables import Job
from worker.fleet.launch import MachineRank, gang_command, reserve_port

REPO = Path(__file__).resolve().parents[2]
RANK0_ADDRESS = "127.0.0.2"


def test_the_command_names_the_whole_gang_and_this_machines_rank() -> None:
    job = Job(id=7, attempts=2, num_processes=4, spec={})
    command = gang_command(
        job, claim_worker_id="w0", machine=MachineRank(rank=1, machines=3, address="10.0.0.5", port=29555)
    )

    assert command[:4] == [command[0], "-m", "accelerate.commands.launch", "--multi_gpu"]
    assert command[4:14] == [
        "--num_processes", "12", "--num_machines", "3", "--machine_rank", "1",
        "--main_process_ip", "10.0.0.5", "--main_process_port", "29555",
    ]  # fmt: skip
    assert command[-6:] == ["--job-id", "7", "--worker-id", "w0", "--attempt", "2"]
    assert command[14:18] == ["--dynamo_backend", "no", "--module", "worker.fleet.child"]


def test_the_reserved_port_is_free_on_every_address_as_the_rendezvous_needs() -> None:
    # torch's TCPStore (rank 0's launcher) listens on every address: a port taken on 127.0.0.1 only
    # fails its bind, so reserving it for 127.0.0.2 must fail too.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        with pytest.raises(OSError, match="no free port"):
            reserve_port(RANK0_ADDRESS, range(port, port + 1))
    # Unconfigured, the port is below the ephemeral range, which outgoing connections draw from.
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    held = reserve_port(RANK0_ADDRESS)
    try:
        assert 1024 <= int(held.getsockname()[1]) < low
    finally:
        held.close()


def _wait_for_both(launches: list[subprocess.Popen[str]], bound_s: float) -> list[str]:
    """Both launchers' output once both have exited; one that fails first (its rendezvous did not
    form) stops the other at once instead of leaving it waiting for a rank 0 that is gone."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        codes = [launch.poll() for launch in launches]
        if all(code is not None for code in codes) or any(code for code in codes):
            break
        time.sleep(0.2)
    for launch in launches:
        if launch.poll() is None:
            os.killpg(launch.pid, signal.SIGKILL)
    return [launch.communicate()[0] for launch in launches]


@pytest.mark.e2e
@pytest.mark.slow
def test_two_machines_form_one_group_over_gloo_and_leave_no_port(tmp_path: Path) -> None:
    job = Job(id=7, attempts=1, num_processes=1, spec={})
    held = reserve_port(RANK0_ADDRESS)
    port = int(held.getsockname()[1])
    held.close()  # rank 0 lets go of it just before its launcher binds it
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    launches = []
    for rank in (0, 1):
        machine = MachineRank(rank=rank, machines=2, address=RANK0_ADDRESS, port=port)
        command = gang_command(job, claim_worker_id="w0", machine=machine, module="tests.support.gang_probe")
        launches.append(
            subprocess.Popen(
                command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, start_new_session=True,
            )
        )  # fmt: skip
    outputs = _wait_for_both(launches, bound_s=240)

    assert [launch.returncode for launch in launches] == [0, 0], outputs
    seen = [
        json.loads(line.split(" ", 1)[1]) for out in outputs for line in out.splitlines() if "PROBE " in line
    ]
    assert sorted((s["rank"], s["main"]) for s in seen) == [(0, True), (1, False)], outputs
    assert {(s["world"], s["sum"], s["backend"]) for s in seen} == {(2, 3.0, "gloo")}
    assert {tuple(s["claim"]) for s in seen} == {("7", "w0", "1")}  # rank 0's claim on both machines
    # Nothing is left listening on the rendezvous port (closed connections may linger in TIME_WAIT).
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect((RANK0_ADDRESS, port))
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind((RANK0_ADDRESS, port))
