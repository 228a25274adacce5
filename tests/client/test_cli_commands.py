"""The CLI covers the API (issue 17, found 3): sweeps (ls, show, cancel, --dry-run), the leaderboard,
rerun with its comparison, a readable `show`, `--json` as one document on every command that has it,
aligned tables, and a closed pipe (`| head`) that ends quietly."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gluejobs.cli import main
from gluejobs.cli.output import table
from shared.core.db import Database
from tests.support.dbutil import finish_as_a_worker
from tests.support.e2e import REPO

SPEC_FLAGS = ["--model_name_or_path", "tiny-bert", "--task_name", "sst2", "--max_train_samples", "16"]


# The commands print what the API answers; the database plays no part: SQLite alone.
pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def cli(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--url", url])
    out, err = capsys.readouterr()
    return code, out, err


def document(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> Any:
    """`argv --json`: exit 0 and one JSON document on stdout."""
    code, out, err = cli(capsys, url, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def columns_line_up(lines: list[str], right: set[str]) -> None:
    """Each header sits over its column: left-aligned values start where it starts, right-aligned
    ones end where it ends."""
    header = lines[0]
    for row in lines[1:]:
        for name in header.split():
            start = header.index(name)
            end = start + len(name)
            if not row[start:end].strip():
                continue  # an empty cell
            if name in right:
                assert row[end - 1] != " " and (end == len(row) or row[end] == " "), (name, header, row)
            else:
                assert row[start] != " " and (start == 0 or row[start - 1] == " "), (name, header, row)


def test_the_issues_commands_sweeps_leaderboard_rerun_and_show(
    live_url: str, db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep_flags = [*SPEC_FLAGS, "--seeds", "1,2", "--grid", "learning_rate=1e-4,5e-4"]

    code, out, _ = cli(capsys, live_url, "sweep", "--dry-run", *sweep_flags)
    assert code == 0 and out.startswith("sweep plan: 4 jobs, seeds [1, 2]; nothing was stored")
    assert "learning_rate=0.0001 seed=1" in out
    assert len(document(capsys, live_url, "sweep", "--dry-run", *sweep_flags)["jobs"]) == 4
    assert document(capsys, live_url, "ls") == []

    sweep = document(capsys, live_url, "sweep", *sweep_flags)
    first, second, third, fourth = sweep["job_ids"]
    for job_id, accuracy in ((first, 0.7), (second, 0.8), (third, 0.6)):
        finish_as_a_worker(
            db,
            job_id,
            {"accuracy": accuracy, "loss": 0.4},
            result={"trainable_params": 4386, "total_params": 1_234_567, "trainable_percent": 0.3553},
        )

    code, out, _ = cli(capsys, live_url, "sweep", "show", str(sweep["id"]))
    assert code == 0 and f"sweep {sweep['id']}: running" in out
    assert "learning_rate=0.0001: jobs" in out and "best evaluation " in out and "final evaluation " in out
    assert "median 0.7500 ± 0.0707 [0.7000–0.8000], n 2" in out
    assert "winner (best evaluation, median): learning_rate=0.0001: accuracy 0.7500" in out
    assert document(capsys, live_url, "sweep", "show", str(sweep["id"]))["winner"]["median"] == 0.75
    code, out, _ = cli(capsys, live_url, "sweep", "ls")
    assert code == 0 and "1 queued, 3 succeeded" in out
    columns_line_up(out.splitlines(), {"id", "jobs"})
    assert [s["id"] for s in document(capsys, live_url, "sweep", "ls")] == [sweep["id"]]
    code, out, _ = cli(capsys, live_url, "sweep", "cancel", str(sweep["id"]))
    assert code == 0 and out.startswith(f"sweep {sweep['id']}: ") and "1 cancelled" in out

    code, out, _ = cli(capsys, live_url, "leaderboard", "--task", "sst2")
    assert code == 0 and out.startswith("sst2 (accuracy; majority-class baseline")
    assert document(capsys, live_url, "leaderboard")[0]["entries"][0]["kind"] == "sweep"

    code, out, _ = cli(capsys, live_url, "rerun", str(first))
    assert code == 0 and out.startswith(f"job {fourth + 1} queued (a rerun of job {first}")
    rerun = fourth + 1
    finish_as_a_worker(db, rerun, {"accuracy": 0.7, "loss": 0.4})

    code, out, _ = cli(capsys, live_url, "show", str(rerun))
    assert code == 0 and re.search(rf"\n  rerun of +job {first}: matched \(exact", out), out
    code, out, _ = cli(capsys, live_url, "show", str(first))
    lines = out.splitlines()
    assert lines[0] == f"job {first}: succeeded (attempt 1 of 3)"
    assert "  parameters  4,386 trainable of 1,234,567 (0.3553%)" in lines
    assert "  headline    accuracy 0.7000 (best 0.7000)" in lines
    assert f"  sweep       {sweep['id']} (learning_rate=0.0001 seed=1)" in lines
    spec = lines[lines.index("spec") + 1 :]
    assert ["task_name", "sst2"] in [line.split() for line in spec]
    assert ["learning_rate", "0.0001"] in [line.split() for line in spec]
    assert len({line.index(line.split()[1]) for line in spec}) == 1  # the values in one column


def test_every_json_option_prints_one_document(
    live_url: str, db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    job = document(capsys, live_url, "submit", *SPEC_FLAGS)
    finish_as_a_worker(db, job["id"], {"accuracy": 0.75})
    queued = document(capsys, live_url, "submit", *SPEC_FLAGS, "--seed", "3")

    assert document(capsys, live_url, "submit", "--dry-run", *SPEC_FLAGS)["dry_run"] is True
    assert [j["id"] for j in document(capsys, live_url, "ls")] == [queued["id"], job["id"]]
    assert document(capsys, live_url, "workers") == []
    assert document(capsys, live_url, "show", str(job["id"]))["status"] == "succeeded"
    assert [r["name"] for r in document(capsys, live_url, "metrics", str(job["id"]), "--split", "eval")] == [
        "accuracy"
    ]
    assert document(capsys, live_url, "resubmit", str(job["id"]), "--set", "seed=9")["spec"]["seed"] == 9
    assert document(capsys, live_url, "rerun", str(job["id"]))["rerun_of"] == job["id"]
    assert document(capsys, live_url, "cancel", str(queued["id"]))["status"] == "cancelled"


def test_the_ls_header_lines_up_with_its_columns(live_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    for flags in (SPEC_FLAGS, ["--model_name_or_path", "tiny-roberta", "--task_name", "mrpc"]):
        assert cli(capsys, live_url, "submit", *flags)[0] == 0

    code, out, _ = cli(capsys, live_url, "ls")

    assert code == 0
    columns_line_up(out.splitlines(), {"id", "metric"})
    assert table(("id", "name"), [["7", "a"], ["12", "bb"]], right={"id"}) == [
        "id  name",
        " 7  a",
        "12  bb",
    ]


def test_a_closed_pipe_ends_the_command_quietly(live_url: str, db: Database, tmp_path: Path) -> None:
    """`gluejobs metrics --csv | head` and `gluejobs ls --json | head`: more output than a pipe
    holds, and a reader that stops after a line."""
    from shared import jobs_repo
    from tests.support.dbutil import claimed

    main(["submit", *SPEC_FLAGS, "--url", live_url])
    with db.session() as session:
        claim = claimed(session)
        rows = [jobs_repo.MetricRow(i / 100, i, "train", "loss", 1.0 / i) for i in range(1, 3001)]
        jobs_repo.add_metrics(session, job_id=claim.job_id, rows=rows, claim=claim)
    for _ in range(40):
        main(["submit", *SPEC_FLAGS, "--url", live_url])
    gluejobs = [sys.executable, "-m", "gluejobs.cli"]
    for command in (["metrics", str(claim.job_id), "--csv"], ["ls", "--json", "--limit", "50"]):
        process = subprocess.Popen(
            [*gluejobs, *command, "--url", live_url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert process.stdout is not None and process.stderr is not None
        assert process.stdout.readline()
        process.stdout.close()  # what `head -1` does once it has its line
        stderr = process.stderr.read().decode()
        assert process.wait(60) == 0 and stderr == "", stderr
