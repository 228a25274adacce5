"""The client and the command line upload for the user: `gluejobs submit --train_file ./mine.csv`
hashes first and uploads only what the API lacks; `gluejobs files ls|upload|rm`;
`client.files.create(path)`; `submit --dry-run` checks a local file and keeps nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gluejobs import AsyncClient, Client
from gluejobs.cli import main as cli
from shared.core.config import Settings
from tests.support.e2e import live_api
from tests.support.kit import TINY_MODEL

ROWS = "".join(f"a sentence that is fine {i},{i % 2}\n" for i in range(24))


def _csv(path: Path, extra: str = "") -> Path:
    path.write_text("sentence,label\n" + ROWS + extra)
    return path


def test_submit_uploads_local_files_once_and_files_commands_manage_them(
    settings_factory: Any, sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings: Settings = settings_factory(sqlite_url)
    train, dev = _csv(tmp_path / "mine.csv"), _csv(tmp_path / "mine-dev.csv", "one more,1\n")
    with live_api(settings) as http:
        url = str(http.base_url)
        with Client(url) as client:
            created = client.files.create(train)
            assert (created.filename, created.rows) == ("mine.csv", 24)
            assert client.files.create(train).id == created.id  # hashed first: not sent again

        flags = [
            "--model_name_or_path",
            TINY_MODEL,
            "--train_file",
            str(train),
            "--validation_file",
            str(dev),
        ]
        assert cli(["submit", "--url", url, *flags, "--max_train_steps", "1"]) == 0
        with Client(url) as client:
            (job,) = list(client.jobs.list())
            files = {f.filename: f for f in client.files.list()}
        assert sorted(files) == ["mine-dev.csv", "mine.csv"]  # mine.csv was already there
        assert (job.spec["train_file"], job.spec["validation_file"]) == (created.id, files["mine-dev.csv"].id)

        # A dry run checks a file the API has not got, prints the checks and keeps nothing.
        other = tmp_path / "other.csv"
        other.write_text("sentence,label\nfine,1\nbad,0\n")
        capsys.readouterr()
        assert (
            cli(
                [
                    "submit",
                    "--url",
                    url,
                    "--dry-run",
                    *flags[:2],
                    "--train_file",
                    str(other),
                    "--validation_file",
                    str(dev),
                ]
            )
            == 0
        )
        printed = capsys.readouterr()
        assert (
            "checked by the API, not uploaded (dry run)" in printed.err
            and '"label_counts": {"0": 1, "1": 1}' in printed.err
        )
        assert "no plan" in printed.err

        assert cli(["files", "ls", "--url", url]) == 0
        listed = capsys.readouterr().out
        assert created.id in listed and "other.csv" not in listed
        assert cli(["files", "rm", "--url", url, created.id]) == 2  # the queued job uses it
        assert "still queued or running" in capsys.readouterr().err
        assert cli(["files", "upload", "--url", url, str(other)]) == 0
        uploaded = capsys.readouterr().out.split()[0]
        assert cli(["files", "rm", "--url", url, uploaded]) == 0


def test_the_async_client_uploads_and_reads_back(
    settings_factory: Any, sqlite_url: str, tmp_path: Path
) -> None:
    settings: Settings = settings_factory(sqlite_url)
    train = tmp_path / "a.jsonl"
    train.write_text("".join(f'{{"sentence": "row {i}", "label": {i % 2}}}\n' for i in range(6)))

    async def checks(url: str) -> None:
        async with AsyncClient(url) as client:
            created = await client.files.create(train, task_name="sst2")
            assert created.checks["label_counts"] == {"negative": 3, "positive": 3}
            assert (await client.files.create(train)).id == created.id
            back = await client.files.download(created.id, tmp_path / "back.jsonl")
            assert back.read_bytes() == train.read_bytes()
            await client.files.delete(created.id)
            assert [f async for f in client.files.list()] == []

    with live_api(settings) as http:
        asyncio.run(checks(str(http.base_url)))
