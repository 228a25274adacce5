"""A malicious (or spoofed) API cannot make `download` write outside its folder, nor exhaust the
client's memory. A real HTTP server on 127.0.0.1 serves crafted artifact listings and tar streams;
the sync client, the async client and the `gluejobs download` command (also as a process) each must
refuse, naming the path, and leave every file outside the target exactly as it was, and nothing
half-written inside it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from gluejobs import ApiError, AsyncClient, Client
from gluejobs.cli import main
from gluejobs.client import RetryPolicy
from tests.support.scripted_server import Exchange, Member, endless, scripted_server, sse, tar_of

REPO = Path(__file__).resolve().parents[2]
CHECKPOINT_PATH = "/v1/jobs/1/artifacts/checkpoints/checkpoint-1"
PWNED = b"written by a hostile server"


@dataclass(frozen=True)
class Attack:
    """What the server lists (or puts in a checkpoint's tar), what the destination already holds
    (links a user might have), and the name the refusal must quote."""

    listing: tuple[str, ...] = ()
    members: tuple[Member, ...] = ()
    links: tuple[tuple[str, str], ...] = ()  # (name in dest, target relative to the test's folder)
    refused: str = ""

    @property
    def checkpoint(self) -> int | None:
        return 1 if self.members else None


def attacks(tmp: Path) -> dict[str, Attack]:
    victim = str(tmp / "outside" / "victim.txt")
    good = Member("checkpoint-1/config.json", b"{}")
    return {
        "dot-dot": Attack(
            listing=("model.safetensors", "../outside/victim.txt"), refused="../outside/victim.txt"
        ),
        "deep-dot-dot": Attack(listing=("../../pwned.txt",), refused="../../pwned.txt"),
        "absolute": Attack(listing=(victim,), refused=victim),
        "dot-dot-inside": Attack(
            listing=("sub/../../outside/victim.txt",), refused="sub/../../outside/victim.txt"
        ),
        "through-a-link-in-dest": Attack(
            listing=("link/victim.txt",), links=(("link", "outside"),), refused="link/victim.txt"
        ),
        "onto-a-link-in-dest": Attack(
            listing=("config.json",), links=(("config.json", "outside/victim.txt"),), refused="config.json"
        ),
        "onto-a-dangling-link": Attack(
            listing=("new.bin",), links=(("new.bin", "outside/new.bin"),), refused="new.bin"
        ),
        "tar-dot-dot": Attack(
            members=(good, Member("../outside/victim.txt", PWNED)), refused="../outside/victim.txt"
        ),
        "tar-absolute": Attack(members=(good, Member(victim, PWNED)), refused=victim),
        "tar-dot-dot-inside": Attack(
            members=(Member("checkpoint-1/a/../../../outside/victim.txt", PWNED),),
            refused="checkpoint-1/a/../../../outside/victim.txt",
        ),
        "tar-symlink": Attack(
            members=(
                good,
                Member("checkpoint-1/out", kind=tarfile.SYMTYPE, linkname=str(tmp / "outside")),
                Member("checkpoint-1/out/victim.txt", PWNED),
            ),
            refused="checkpoint-1/out",
        ),
        "tar-relative-symlink": Attack(
            members=(Member("checkpoint-1/up", kind=tarfile.SYMTYPE, linkname="../.."),),
            refused="checkpoint-1/up",
        ),
        "tar-hardlink": Attack(
            members=(
                Member("checkpoint-1/hard", kind=tarfile.LNKTYPE, linkname=victim),
                Member("checkpoint-1/hard", PWNED),
            ),
            refused="checkpoint-1/hard",
        ),
        "tar-through-a-link-in-dest": Attack(
            members=(Member("checkpoint-1/victim.txt", PWNED),),
            links=(("checkpoint-1", "outside"),),
            refused="checkpoint-1/victim.txt",
        ),
    }


def hostile_api(attack: Attack) -> Callable[[Exchange], None]:
    def answer(exchange: Exchange) -> None:
        if exchange.path == "/v1/jobs/1/artifacts":
            exchange.json(
                {"data": [{"path": p, "size": len(PWNED), "kind": "model"} for p in attack.listing]}
            )
        elif exchange.path == CHECKPOINT_PATH:
            exchange.send(200, tar_of(attack.members), "application/x-tar")
        else:  # any file it listed: the bytes it wants written
            exchange.send(
                200, PWNED * (1000 if exchange.path.endswith("big.bin") else 1), "application/octet-stream"
            )

    return answer


def snapshot(root: Path, skip: Path) -> dict[str, bytes | str]:
    """Every path under `root` but `skip`, with its bytes (or a link's target)."""
    seen: dict[str, bytes | str] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if Path(folder, d) != skip]
        for name in dirs + files:
            path = Path(folder, name)
            if path.is_symlink():
                seen[str(path)] = f"-> {os.readlink(path)}"
            elif path.is_file():
                seen[str(path)] = path.read_bytes()
            else:
                seen[str(path)] = "dir"
    return seen


def refused_by_sync(url: str, dest: Path, checkpoint: int | None) -> str:
    with Client(url, retries=0) as client, pytest.raises(ApiError) as caught:
        client.jobs.download(1, dest, checkpoint=checkpoint)
    assert caught.value.code == "unsafe_path", caught.value
    return str(caught.value)


def refused_by_async(url: str, dest: Path, checkpoint: int | None) -> str:
    async def download() -> None:
        async with AsyncClient(url, retries=0) as client:
            await client.jobs.download(1, dest, checkpoint=checkpoint)

    with pytest.raises(ApiError) as caught:
        asyncio.run(download())
    assert caught.value.code == "unsafe_path", caught.value
    return str(caught.value)


def refused_by_cli(url: str, dest: Path, checkpoint: int | None) -> str:
    """`gluejobs download` as its entry point runs it (gluejobs.cli.main), in this process: a fresh
    interpreter importing the CLI costs about a second an attack; "cli-process" runs it as one."""
    stderr = io.StringIO()
    unset = {k: v for k, v in os.environ.items() if not k.startswith("GLUEJOBS_")}
    with mock.patch.dict(os.environ, unset, clear=True), contextlib.redirect_stderr(stderr):
        status = main(["download", "1", str(dest), "--url", url, *_checkpoint_flags(checkpoint)])
    return _refused_by_the_command(status, stderr.getvalue())


def refused_by_cli_process(url: str, dest: Path, checkpoint: int | None) -> str:
    command = [sys.executable, "-m", "gluejobs.cli", "download", "1", str(dest), "--url", url]
    result = subprocess.run(
        [*command, *_checkpoint_flags(checkpoint)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith("GLUEJOBS_")},
    )
    return _refused_by_the_command(result.returncode, result.stderr)


def _checkpoint_flags(checkpoint: int | None) -> list[str]:
    return ["--checkpoint", str(checkpoint)] if checkpoint is not None else []


def _refused_by_the_command(status: int, stderr: str) -> str:
    assert status == 2, stderr
    assert stderr.startswith("gluejobs download: path: refused the "), stderr
    assert "Traceback" not in stderr
    return stderr


RUNNERS = {
    "sync": refused_by_sync,
    "async": refused_by_async,
    "cli": refused_by_cli,
    "cli-process": refused_by_cli_process,
}
# Every attack against the clients and the command; the command in a process of its own against one
# bad listing and one bad tar (the exit status and stderr a shell sees).
CASES = [(name, runner) for name in attacks(Path("/x")) for runner in ("sync", "async", "cli")] + [
    ("dot-dot", "cli-process"),
    ("tar-symlink", "cli-process"),
]


@pytest.mark.parametrize(("name", "runner"), CASES)
def test_a_hostile_server_cannot_write_outside_the_download_folder(
    tmp_path: Path, name: str, runner: str
) -> None:
    attack = attacks(tmp_path)[name]
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "victim.txt").write_text("the user's own file")
    dest = tmp_path / "work" / "dest"
    dest.mkdir(parents=True)
    for link, target in attack.links:
        (dest / link).symlink_to(tmp_path / target)
    before, dest_before = snapshot(tmp_path, skip=dest), snapshot(dest, skip=tmp_path / "none")

    with scripted_server(hostile_api(attack)) as (url, seen):
        message = RUNNERS[runner](url, dest, attack.checkpoint)

    assert repr(attack.refused) in message, message
    assert str(dest.resolve()) in message and "nothing" in message
    assert snapshot(tmp_path, skip=dest) == before  # nothing outside the target changed or appeared
    assert snapshot(dest, skip=tmp_path / "none") == dest_before  # nothing written inside, no partial file
    assert (tmp_path / "outside" / "victim.txt").read_text() == "the user's own file"
    if attack.listing:  # a bad listing is refused before the first file is fetched
        assert seen.paths() == ["/v1/jobs/1/artifacts"]


def test_an_honest_server_downloads_files_and_a_checkpoint_inside_the_folder(tmp_path: Path) -> None:
    """The same server and clients with an honest answer: the refusals above are the guard's. A
    download streams to disk: the cap on answers held in memory does not apply to it."""
    honest = Attack(
        listing=("model.safetensors", "sub/../vocab.txt", "predictions/SST-2.tsv", "big.bin"),
        members=(
            Member("checkpoint-1", kind=tarfile.DIRTYPE),
            Member("checkpoint-1/state.json", b'{"step": 1}'),
            Member("checkpoint-1/optimizer/shard.bin", b"\0" * 5000),
        ),
    )
    for runner in ("sync", "async"):
        dest = tmp_path / runner
        with scripted_server(hostile_api(honest)) as (url, _):
            if runner == "sync":
                with Client(url, max_answer_bytes=1024) as client:
                    client.jobs.download(1, dest)
                    client.jobs.download(1, dest, checkpoint=1)
            else:

                async def download(url: str = url, dest: Path = dest) -> None:
                    async with AsyncClient(url, max_answer_bytes=1024) as client:
                        await client.jobs.download(1, dest)
                        await client.jobs.download(1, dest, checkpoint=1)

                asyncio.run(download())
        assert (dest / "model.safetensors").read_bytes() == PWNED
        assert (dest / "vocab.txt").read_bytes() == PWNED
        assert (dest / "predictions" / "SST-2.tsv").read_bytes() == PWNED
        assert (dest / "checkpoint-1" / "state.json").read_bytes() == b'{"step": 1}'
        assert (dest / "checkpoint-1" / "optimizer" / "shard.bin").stat().st_size == 5000
        assert (dest / "big.bin").read_bytes() == PWNED * 1000
        written = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
        assert written == [
            "big.bin",
            "checkpoint-1/optimizer/shard.bin",
            "checkpoint-1/state.json",
            "model.safetensors",
            "predictions/SST-2.tsv",
            "vocab.txt",
        ]


def test_a_transfer_cut_short_leaves_no_partial_file(tmp_path: Path) -> None:
    """A connection that dies mid-file is tried again; when every try dies, nothing is left."""

    def dying(exchange: Exchange) -> None:
        exchange.chunked([b"x" * 10_000], "application/octet-stream", complete=False)

    quick = RetryPolicy(retries=2, backoff_base_s=0.01)
    with (
        scripted_server(dying) as (url, seen),
        Client(url, retries=quick) as client,
        pytest.raises(ApiError) as caught,
    ):
        client.jobs.download(1, tmp_path / "dest", path="model.safetensors")
    assert caught.value.code == "unreachable"
    assert seen.paths() == ["/v1/jobs/1/artifacts/model.safetensors"] * 3
    assert list((tmp_path / "dest").iterdir()) == []


# ---------------------------------------------------------------------------------------------------
# Size caps: an endless answer is refused, not held in memory
# ---------------------------------------------------------------------------------------------------

CAP = 1 << 20


FLOOD_BYTES = 80 << 20  # beyond every cap, the defaults' too


def flooding(exchange: Exchange) -> None:
    """Answers without end, as far as any cap can tell: they do end after FLOOD_BYTES, so that a
    client without a guard fails the test instead of hanging it."""
    piece = b"a" * 65536
    flood = itertools.islice(endless(piece), FLOOD_BYTES // len(piece))
    if exchange.path == "/v1/jobs/1":
        exchange.chunked((b'{"id": 1, "spec": "', *flood, b'"}'), "application/json")
    elif exchange.path == "/v1/jobs/2":
        exchange.head(200, "application/json", {"Content-Length": str(1 << 40)})  # announced, never sent
    elif exchange.path == "/v1/jobs/1/stream":  # one endless line
        exchange.chunked((b"id: 1.0\nevent: metric\ndata: ", *flood, b"\n\n"), "text/event-stream")
    elif exchange.path == "/v1/jobs/2/stream":  # short lines, one endless event
        lines = (b"data: " + piece[:1000] + b"\n" for piece in flood)
        exchange.chunked((*lines, b"\n", sse("end", {"status": "succeeded"}, "9.9")), "text/event-stream")


def test_endless_answers_and_stream_lines_are_refused(tmp_path: Path) -> None:
    with scripted_server(flooding) as (url, _):
        with Client(url, retries=0, max_answer_bytes=CAP, max_stream_line_bytes=CAP) as client:
            for job_id in (1, 2):
                with pytest.raises(ApiError) as too_large:
                    client.jobs.get(job_id)
                assert too_large.value.code == "answer_too_large" and f"over {CAP} bytes" in str(
                    too_large.value
                )
                with pytest.raises(ApiError) as line:
                    list(client.jobs.stream(job_id))
                assert line.value.code == "answer_too_large" and f"over {CAP} bytes" in str(line.value)

        async def async_checks() -> None:
            async with AsyncClient(url, retries=0, max_answer_bytes=CAP, max_stream_line_bytes=CAP) as client:
                with pytest.raises(ApiError, match="answer_too_large"):
                    await client.jobs.get(1)
                with pytest.raises(ApiError, match="answer_too_large"):
                    [m async for m in client.jobs.stream(1)]

        asyncio.run(async_checks())

        # The defaults hold too (64 MiB for an answer, 4 MiB for a stream line), through the CLI.
        for command in (["show", "1"], ["metrics", "1", "--follow"]):
            result = subprocess.run(
                [sys.executable, "-m", "gluejobs.cli", *command, "--url", url],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=REPO,
            )
            assert result.returncode == 2 and re.search(r"over \d+ bytes.*; refused", result.stderr), (
                result.stderr
            )
