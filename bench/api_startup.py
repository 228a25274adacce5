"""How soon a restarted API is ready: from `python -m service` (what `gluejobs serve` runs) exec to its
first 200 of /readyz, on a migrated SQLite database, with the machine idle and with BUSY busy-loop
processes, for this tree and a baseline revision, turns interleaved in the same run; then where this
tree's start goes (python -X importtime, and cProfile of create_app and the lifespan's start).

    .venv/bin/python bench/api_startup.py [--baseline REV] [--runs N] [--busy 2]
    .venv/bin/python bench/api_startup.py --imports   # the lazy imports' change alone (IMPORT_FILES)

The baseline is a copy of this working tree with the start-up's files (START_FILES) as they were at
REV, run with this interpreter from its own folder (so its `service` package is the one imported).
Each tree starts once first (its database migrated, its bytecode cached): the runs measured are
restarts.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = "4481348"  # the commit before the start-up's changes (issue 34 item 4)
START_FILES = [
    "service/main.py",
    "service/server.py",
    "service/routes/health.py",
    "shared/core/release.py",
    "shared/core/migrate.py",
]
# The modules that import pandas, pyarrow, numpy and Optuna where they read (a request, a child), not
# at the API's start, and the commit before that change: `--imports` compares with them as they were.
IMPORTS_BASELINE = "7f035c7"
IMPORT_FILES = [
    "service/dry_run/plan.py",
    "service/dry_run/tokenizer_child.py",
    "service/files/upload_checks.py",
    "service/research/baselines.py",
    "shared/data/limits.py",
    "shared/data/quality_warnings.py",
    "shared/data/reading.py",
    "shared/jobspec/upload_tally.py",
    "shared/searches/optimizer.py",
    "shared/admission/data_checks.py",
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def baseline_tree(revision: str, files: list[str], into: Path) -> Path:
    """This working tree (its tracked and untracked files, not the ignored ones), with `files` as they
    were at `revision`: the start-up's own changes undone, everything else the same."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    for name in files:
        old = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{revision}:{name}"], check=True, capture_output=True
        )
        (into / name).write_bytes(old.stdout)
    return into


def environment(work: Path, name: str) -> dict[str, str]:
    return {
        **os.environ,
        "GLUEJOBS_DATABASE_URL": f"sqlite:///{work / name}.db",
        "GLUEJOBS_ARTIFACTS_DIR": str(work / name / "artifacts"),
        "GLUEJOBS_DATA_DIR": str(work / name / "data"),
        "PYTHONPATH": "",
    }


def cpu_seconds(pid: int) -> float:
    """The CPU time of a process and of its children it has reaped (its forked schema check)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def time_to_ready(tree: Path, env: dict[str, str], log: Path) -> tuple[float, float]:
    """Seconds from exec to the first 200 of /readyz, and the CPU seconds the API spent till then."""
    port = free_port()
    started = time.perf_counter()
    with log.open("ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "service", "--port", str(port)],
            cwd=tree,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                    return time.perf_counter() - started, cpu_seconds(process.pid)
            if process.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:]
                raise SystemExit(f"the API in {tree} exited with {process.returncode}:\n{tail}")
            time.sleep(0.02)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)


@contextlib.contextmanager
def busy(count: int) -> Iterator[None]:
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def import_profile(env: dict[str, str], top: int) -> str:
    """The modules whose import (with what they import) costs most, as `-X importtime` measures."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import service.server; service.server.import_the_api()"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []  # (cumulative microseconds, depth, module)
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self_us, cumulative_us, name = line.removeprefix("import time:").split("|")
        depth = (len(name) - len(name.lstrip()) - 1) // 2
        rows.append((int(cumulative_us), depth, name.strip()))
    total = next(us for us, depth, name in rows if name == "service.main")
    shallow = sorted((row for row in rows if row[1] <= 3), reverse=True)[:top]
    lines = [f"  {us / 1e6:6.2f} s  {'  ' * depth}{name}" for us, depth, name in shallow]
    return f"import service.main: {total / 1e6:.2f} s in all; the largest (cumulative):\n" + "\n".join(lines)


def start_profile(env: dict[str, str], top: int) -> str:
    """cProfile of create_app and the lifespan's start, in this process (the API imported first)."""
    os.environ.update({k: v for k, v in env.items() if k.startswith("GLUEJOBS_")})
    import asyncio

    from service.main import create_app
    from shared.core.config import get_settings

    settings = get_settings()
    profile = cProfile.Profile()

    async def lifespan_start() -> None:
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            pass

    profile.enable()
    started = time.perf_counter()
    asyncio.run(lifespan_start())
    took = time.perf_counter() - started
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(r"work/main/(service|shared)", top)
    body = [line for line in out.getvalue().splitlines() if "/work/main/" in line]
    return f"create_app + lifespan start: {took:.2f} s (profiled); by cumulative time:\n" + "\n".join(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE)
    parser.add_argument("--files", nargs="+", default=START_FILES, help="the files taken from the baseline")
    parser.add_argument(
        "--imports", action="store_true", help=f"baseline {IMPORTS_BASELINE} with IMPORT_FILES as they were"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--busy", type=int, default=2, help="busy-loop processes for the loaded case")
    parser.add_argument("--top", type=int, default=14)
    args = parser.parse_args()
    if args.imports:
        args.baseline, args.files = IMPORTS_BASELINE, IMPORT_FILES
    with tempfile.TemporaryDirectory(prefix="api-startup-") as scratch:
        work = Path(scratch)
        before = baseline_tree(args.baseline, args.files, work / "baseline-tree")
        trees = {"baseline": before, "this tree": ROOT}
        envs = {name: environment(work, name.replace(" ", "-")) for name in trees}
        log = work / "api.log"
        for name, tree in trees.items():  # the first start migrates and fills the bytecode caches
            time_to_ready(tree, envs[name], log)
        print(f"cpus: {os.cpu_count()}, load average at start: {os.getloadavg()[0]:.1f}")
        for case, loaded in (("idle", 0), (f"{args.busy} busy loops", args.busy)):
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
            with busy(loaded):
                for _ in range(args.runs):
                    for name, tree in trees.items():  # interleaved: a drift in load hits both
                        times[name].append(time_to_ready(tree, envs[name], log))
            for name, values in times.items():
                figures = ", ".join(f"{wall:.2f}" for wall, _cpu in values)
                cpu = statistics.median(cpu for _wall, cpu in values)
                print(
                    f"{case:>14} | {name:<9} ({args.baseline if name == 'baseline' else 'HEAD+'}): "
                    f"median {statistics.median(wall for wall, _cpu in values):.2f} s to ready "
                    f"({figures}), {cpu:.2f} s of CPU"
                )
        print()
        print(import_profile(envs["this tree"], args.top))
        print()
        print(start_profile(envs["this tree"], args.top))


if __name__ == "__main__":
    main()
