"""Starting a job's child process and stopping it: the command, its environment, the process group.

A job runs in a process of its own so that its crash, out-of-memory kill or cancel ends only that
job. Every child leads its own process group (session), so a stop reaches all of it, `accelerate
launch` and its ranks included. `ChildProcess` is what the supervisor needs of a child, whichever
way it was started: here a plain subprocess (cold start, and every multi-process job), in
worker/fleet/warm.py a fork of a template process with torch already imported.

Torch-free: the worker's parent imports this module.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sqlalchemy import make_url

from shared.core.config import Settings
from shared.core.tables import Job
from worker.fleet.devices import cpu_threads, cuda_visible_devices
from worker.fleet.liveness import WORKER_PID_ENV
from worker.training.checkpoints import ATTEMPT_ENV
from worker.training.determinism import job_environment


class ChildProcess(Protocol):
    """A running job process that leads its own process group."""

    @property
    def pid(self) -> int: ...

    def wait(self, timeout: float | None) -> int | None:
        """The exit status (negative: killed by that signal), or None if still running after timeout."""
        ...

    def signal_group(self, sig: signal.Signals) -> bool:
        """Send sig to the child's whole process group; False when it has already gone."""
        ...


class SubprocessChild:
    """`python -m worker.fleet.child …` (or `accelerate launch … worker.fleet.child`): a fresh interpreter."""

    def __init__(self, command: list[str], env: Mapping[str, str], log_path: Path) -> None:
        with log_path.open("ab") as log:
            self._popen = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,  # its own process group: a stop reaches all of it
            )

    @property
    def pid(self) -> int:
        return self._popen.pid

    def wait(self, timeout: float | None) -> int | None:
        try:
            return self._popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal_group(self, sig: signal.Signals) -> bool:
        try:
            os.killpg(self._popen.pid, sig)
        except ProcessLookupError:
            return False
        return True


def terminate(child: ChildProcess, *, grace_s: float, first: signal.Signals = signal.SIGTERM) -> None:
    """`first` to the child's process group (SIGTERM: a job's process saves a checkpoint at its next
    step and exits; SIGINT: it stops at once), then SIGKILL what is left after the grace period."""
    for sig, wait_s in ((first, grace_s), (signal.SIGKILL, None)):
        if not child.signal_group(sig):
            child.wait(None)  # reap it
            return
        if child.wait(wait_s) is not None:
            return


def child_args(job: Job, *, worker_id: str) -> list[str]:
    """The arguments of `python -m worker.fleet.child`, whichever way the child is started. They carry
    the claim (worker and attempt) that fences its writes (worker/fleet/child.py)."""
    return ["--job-id", str(job.id), "--worker-id", worker_id, "--attempt", str(job.attempts)]


def child_command(job: Job, *, worker_id: str) -> list[str]:
    """The command of the job's child: `python -m worker.fleet.child`, or `accelerate launch` of it."""
    processes = job_processes(job)
    claim = child_args(job, worker_id=worker_id)
    if processes == 1:
        return [sys.executable, "-m", "worker.fleet.child", *claim]
    # `--multi_gpu` is accelerate's name for "one process per device through torch.distributed";
    # without a GPU the processes share the CPU over gloo, which is how the tests run it.
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--main_process_port",
        str(_free_port()),
        "--dynamo_backend",
        "no",
        "--module",
        "worker.fleet.child",
        *claim,
    ]


@dataclass(frozen=True)
class MachineRank:
    """This worker's part in a job of several machines (a gang, shared/jobs_repo/gangs.py): its rank
    among the `machines`, and rank 0's rendezvous (its advertised address and the port it reserved)."""

    rank: int
    machines: int
    address: str
    port: int


def gang_command(
    job: Job, *, claim_worker_id: str, machine: MachineRank, module: str = "worker.fleet.child"
) -> list[str]:
    """The command of one machine's part of a job of several machines: `accelerate launch` with
    Accelerate's static multi-machine rendezvous (rank 0's launcher hosts torch's c10d TCPStore at
    address:port; every member connects to it), the job's processes on each machine, and the claim
    of the attempt, which is rank 0's (`claim_worker_id`) on every machine. Global rank 0 (on
    machine 0) is the main process: it alone writes rows, checkpoints and the model, the same rule
    as for the several processes of one machine. Over gloo on CPU (worker/training/loop.py forces the CPU
    when WORLD_SIZE > 1 and no GPU is there), NCCL on GPUs."""
    processes = job_processes(job)
    claim = ["--job-id", str(job.id), "--worker-id", claim_worker_id, "--attempt", str(job.attempts)]
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(processes * machine.machines),  # accelerate's count is the whole gang's
        "--num_machines",
        str(machine.machines),
        "--machine_rank",
        str(machine.rank),
        "--main_process_ip",
        machine.address,
        "--main_process_port",
        str(machine.port),
        "--dynamo_backend",
        "no",
        "--module",
        module,
        *claim,
    ]


def reserve_port(address: str, ports: range | None = None) -> socket.socket:
    """A bound socket that holds the gang's rendezvous port until rank 0 launches: the caller closes
    it just before, so no other job of this machine takes the port in between.

    The port is checked the way rank 0's launcher will use it: torch's TCPStore listens on every
    address, so a port that is free on `address` alone but taken on another (an API on 127.0.0.1, a
    database connection's local end) would fail the launch with EADDRINUSE. So the socket binds the
    wildcard; `address` is only what the other machines are told. Without `ports`, the port is one
    below the system's ephemeral range: a port from that range can be handed to any outgoing
    connection in the moment between closing this socket and the launcher's bind."""
    candidates = list(ports) if ports is not None else _ports_outside_the_ephemeral_range()
    for port in candidates:
        sock = socket.socket()
        try:
            sock.bind(("", port))
        except OSError:
            sock.close()
            continue
        return sock
    where = f"in {ports.start}-{ports.stop - 1}" if ports is not None else "below the ephemeral range"
    raise OSError(f"no free port for a gang's rendezvous on {address} {where}")


# Linux's default ephemeral range starts here (macOS's and Windows' at 49152): the fallback when
# /proc does not say.
_EPHEMERAL_LOW_DEFAULT = 32768
_RENDEZVOUS_BAND = 8192  # how many ports below the ephemeral range rank 0 tries, in random order


def _ports_outside_the_ephemeral_range() -> list[int]:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = _EPHEMERAL_LOW_DEFAULT
    first = max(1024, low - _RENDEZVOUS_BAND)
    candidates = list(range(first, low)) or list(range(1024, 65536))
    random.shuffle(candidates)  # workers of one machine reserving at once try different ports
    return candidates


def gang_ports(settings: Settings) -> range | None:
    """GLUEJOBS_GANG_PORTS ("29500-29599") as a range, or None (reserve_port then picks a port below
    the ephemeral range)."""
    if settings.gang_ports is None:
        return None
    first, last = (int(part) for part in settings.gang_ports.split("-"))
    if not 0 < first <= last <= 65535:
        raise ValueError(
            f"GLUEJOBS_GANG_PORTS {settings.gang_ports!r}: needs FIRST-LAST, 1 <= FIRST <= LAST <= 65535"
        )
    return range(first, last + 1)


def advertised_address(settings: Settings) -> str:
    """The address this worker gives the other machines of its gang (GLUEJOBS_GANG_ADDRESS): by
    default the one its own traffic to the database's host leaves from, which the other workers,
    who reach the same database, can most likely reach too; 127.0.0.1 for SQLite (one machine)."""
    if settings.gang_address:
        return settings.gang_address
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite" or not url.host or url.host.startswith("/"):
        return "127.0.0.1"
    # A UDP "connect" sends nothing: it only asks the kernel which local address routes there.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((url.host, url.port or 5432))
        except OSError:
            return socket.gethostbyname(socket.gethostname())
        return str(probe.getsockname()[0])


def job_processes(job: Job) -> int:
    """How many processes (and so devices or CPU slots) the job runs on."""
    return max(1, int(job.num_processes or job.spec.get("num_processes") or 1))


def _free_port() -> int:
    """A port for the job's rendezvous: two multi-process jobs on one machine must not share one."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_environment(settings: Settings) -> dict[str, str]:
    """The worker's environment plus its settings, so the child sees exactly what the worker sees."""
    env = dict(os.environ)
    for name, value in settings.model_dump().items():
        if isinstance(value, list):
            value = ",".join(value)
        if value is not None:
            env[f"GLUEJOBS_{name.upper()}"] = str(value)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def job_child_environment(
    settings: Settings, job: Job, devices: list[str], pool: Sequence[str] = ()
) -> dict[str, str]:
    """Everything one job's child starts with: the worker's environment and settings, the job's own
    variables, only the GPUs it holds (on CPU slots, its share of the cores among the worker's
    `pool`), the worker's pid, which the child watches so that it never outlives its worker
    (worker/fleet/liveness.py), and the attempt, which names its checkpoints' staging folders
    (worker/training/checkpoints.py)."""
    return {
        **child_environment(settings),
        **job_environment(job.spec),
        **cpu_threads(devices, pool),
        "CUDA_VISIBLE_DEVICES": cuda_visible_devices(devices),
        WORKER_PID_ENV: str(os.getpid()),
        ATTEMPT_ENV: str(job.attempts),
    }
