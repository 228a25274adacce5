"""The README's and the documentation's commands run as written (issue 17, must-hold 6; issue 24, item 5).

Every `curl` command in README.md and in every page of the documentation site (mkdocs.yml's nav, in
its order, after the README; in code blocks and inline) and every `gluejobs` line of a shell code
block (or a `$ ` prompt line of any block) runs, in that order, against one live local stack
(gluejobs_server/stack.py: an API, no worker, so jobs stay queued), and must exit 0. What the test adds, and
nothing else: `localhost:8000` points at the stack's port, `GLUEJOBS_URL` at the stack, `curl` fails
on an HTTP error (`--fail-with-body`), and the working folder holds the files the lines name
(`roberta_base_mnli.sh`, `training_args.json`, `train.csv`). Lines other branches add are picked up
as they are. A command that cannot run here is marked in its page with `<!-- not run: the reason -->`:
alone on the line before a code block, a table or a paragraph, for every command in it; on a line,
for that line. Inline `gluejobs …` mentions in prose and tables name commands (synopses with
placeholders); they are not lines to run.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gluejobs_server.stack import local_stack, stack_environment
from shared.core.config import Settings
from tests.support.kit import GLUE_DATA, REPO, write_mnli
from tests.support.lora_scripts import ROBERTA_BASE_MNLI

MARK = re.compile(r"<!--\s*not run:\s*(?P<reason>.*?)\s*-->")
FENCE = re.compile(r"^\s*(?P<fence>```+)(?P<lang>[\w-]*)")
INLINE = re.compile(r"`([^`\n]+)`")
SHELL_BLOCKS = frozenset({"sh", "bash", "shell", "console"})
COMMANDS = ("curl", "gluejobs")
README_PORT = "8000"
# The least the README and the pages hold today: an extraction that finds fewer has gone wrong, not them.
AT_LEAST = 30
# Pages the build writes (docs/hooks/openapi.py), not files of the repository: nothing to run.
GENERATED_PAGES = frozenset({"reference/api.md"})
# The test's one addition to `curl`: an HTTP error is a failure.
PRELUDE = 'curl() { command curl --fail-with-body --show-error --max-time 60 "$@"; }\n'
TRAINING_ARGS = {
    "model_name_or_path": "bert-base-cased",
    "task_name": "mrpc",
    "output_dir": "mrpc-out",
    "learning_rate": 2e-5,
    "per_device_train_batch_size": 16,
    "num_train_epochs": 2.5,
    "eval_strategy": "epoch",
    "save_strategy": "epoch",
    "load_best_model_at_end": True,
    "metric_for_best_model": "f1",
    "greater_is_better": True,
}


@dataclass(frozen=True)
class Command:
    line: int  # where it starts in its file
    text: str
    not_run: str | None  # the page's reason, when marked
    source: str = "README.md"  # the file, relative to the repository


def nav_pages(config: Path) -> list[str]:
    """The site's pages in the nav's order (paths under docs/), as mkdocs.yml lists them."""
    pages: list[str] = []

    def walk(entry: object) -> None:
        if isinstance(entry, str):
            pages.append(entry)
        elif isinstance(entry, list):
            for item in entry:
                walk(item)
        elif isinstance(entry, dict):
            for value in entry.values():
                walk(value)

    walk(yaml.safe_load(config.read_text())["nav"])
    return pages


def documents() -> list[Path]:
    """The README, then every page of the site that is a file here, in the nav's order."""
    docs = REPO / "docs"
    return [REPO / "README.md"] + [
        docs / page for page in nav_pages(REPO / "mkdocs.yml") if page not in GENERATED_PAGES
    ]


def all_commands() -> list[Command]:
    commands: list[Command] = []
    for path in documents():
        source = str(path.relative_to(REPO))
        commands += [Command(c.line, c.text, c.not_run, source) for c in readme_commands(path.read_text())]
    return commands


def readme_commands(text: str) -> list[Command]:
    """A page's curl and gluejobs commands, in order, with the marks that keep them from running."""
    lines = text.splitlines()
    commands: list[Command] = []
    pending: str | None = None  # a mark alone on its line: for the block that follows
    covered = False  # whether that block has begun
    index = 0
    while index < len(lines):
        line = lines[index]
        mark = MARK.search(line)
        if mark and not MARK.sub("", line).strip():
            pending, covered = mark["reason"], False
            index += 1
            continue
        fence = FENCE.match(line)
        if fence:
            end = index + 1
            while end < len(lines) and not lines[end].strip().startswith(fence["fence"]):
                end += 1
            shell = fence["lang"] in SHELL_BLOCKS
            for number, command in block_commands(lines[index + 1 : end], index + 2, shell=shell):
                commands.append(Command(number, command, pending))
            pending, index = None, end + 1
            continue
        if not line.strip():
            pending = None if covered else pending
        else:
            covered = True
            reason = mark["reason"] if mark else pending
            commands += [
                Command(index + 1, span, reason) for span in INLINE.findall(line) if span.startswith("curl ")
            ]
        index += 1
    return commands


def block_commands(lines: list[str], first: int, *, shell: bool) -> list[tuple[int, str]]:
    """A code block's commands: logical lines (continued by a trailing backslash or an open quote)
    whose first word is curl or gluejobs; outside shell blocks, only `$ ` prompt lines."""
    found: list[tuple[int, str]] = []
    pending: list[str] = []
    start = first
    for number, line in enumerate(lines, start=first):
        if not pending:
            start = number
            if not shell:
                if not line.startswith("$ "):
                    continue
                line = line[2:]
        pending.append(line)
        joined = "\n".join(pending)
        if joined.endswith("\\") or not _balanced(joined):
            continue
        pending = []
        words = joined.split(maxsplit=1)
        if words and words[0] in COMMANDS:
            found.append((start, joined))
    return found


def _balanced(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:  # "No closing quotation": the command goes on on the next line
        return False
    return True


# ---------------------------------------------------------------------------------------------------


def test_the_extraction_follows_the_marks() -> None:
    text = """\
Inline: `curl localhost:8000/healthz` and `gluejobs ls [--json]` (a synopsis).

<!-- not run: needs a GPU -->
```sh
gluejobs submit --fp16 --model_name_or_path m --task_name sst2
```

```sh
make demo
curl -s -X POST localhost:8000/v1/jobs -d '{
  "spec": {}}'
gluejobs ls \\
  --json   # a comment
```

```
$ curl -N localhost:8000/v1/jobs/1/stream
event: metric
```

<!-- not run: needs a worker -->
| a | `curl localhost:8000/v1/jobs/1/logs` |
| b | `curl localhost:8000/v1/jobs/1/artifacts` |

| c | `curl localhost:8000/metrics` <!-- not run: needs keys --> |
| d | `curl localhost:8000/readyz` |
"""
    commands = readme_commands(text)

    assert [(c.line, c.not_run) for c in commands] == [
        (1, None),
        (5, "needs a GPU"),
        (10, None),
        (12, None),
        (17, None),
        (22, "needs a worker"),
        (23, "needs a worker"),
        (25, "needs keys"),
        (26, None),
    ]
    assert commands[2].text == "curl -s -X POST localhost:8000/v1/jobs -d '{\n  \"spec\": {}}'"
    assert commands[4].text == "curl -N localhost:8000/v1/jobs/1/stream"


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    """The README's commands, not a database: SQLite alone."""
    return sqlite_url


@pytest.fixture
def readme_settings(settings: Settings, tmp_path: Path, glue_data: Path) -> Settings:
    """GLUE as the README's lines need it: the kit's MRPC and SST-2, and a small MNLI."""
    glue = tmp_path / "glue"
    glue.mkdir()
    for task in ("MRPC", "SST-2"):
        (glue / task).symlink_to(glue_data / task)
    write_mnli(glue / "MNLI")
    return settings.model_copy(update={"glue_dir": glue})


def test_every_page_of_the_site_is_in_the_nav_and_there() -> None:
    """The pages whose commands run are the site's: each page under docs/ is in the nav, and each nav
    entry but the generated one is a file (mkdocs --strict says the same; this says it without mkdocs)."""
    docs = REPO / "docs"
    listed = set(nav_pages(REPO / "mkdocs.yml"))
    on_disk = {str(p.relative_to(docs)) for p in docs.rglob("*.md")}
    assert on_disk - listed == set(), "pages missing from mkdocs.yml's nav"
    assert listed - on_disk == GENERATED_PAGES, "nav entries that are neither files nor generated"
    sources = {c.source for c in all_commands()}
    assert {"README.md", "docs/users/http-api.md", "docs/operators/fair-share.md"} <= sources, sources


@pytest.mark.e2e
def test_the_readme_commands_run_as_written(readme_settings: Settings, tmp_path: Path) -> None:
    commands = all_commands()
    marked = [c for c in commands if c.not_run is not None]
    assert not [c for c in marked if not c.not_run], "a `not run` mark without its reason"
    to_run = [c for c in commands if c.not_run is None]
    assert len(to_run) >= AT_LEAST, [c.text for c in commands]

    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "roberta_base_mnli.sh").write_text(ROBERTA_BASE_MNLI)
    (workspace / "training_args.json").write_text(json.dumps(TRAINING_ARGS))
    # `train.csv`, the user's own file the upload lines send: SST-2's first rows as a CSV.
    rows = (GLUE_DATA / "SST-2" / "train.tsv").read_text().splitlines()[1:65]
    with (workspace / "train.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows([("sentence", "label"), *(row.rsplit("\t", 1) for row in rows)])
    # The README's lines name Hub ids (bert-base-uncased), which this machine cannot reach. An API offline
    # by configuration (HF_HUB_OFFLINE=1) refuses an id missing from its Hub cache (issue 35); one told
    # not to ask the Hub (GLUEJOBS_HUB_CHECK_TIMEOUT_S=0) takes it with a warning, as a user's API with a
    # network takes an id the Hub has. The API makes no other Hub request.
    settings = readme_settings.model_copy(update={"hub_check_timeout_s": 0.0})
    api_env = stack_environment(settings)
    with local_stack(settings, logs=tmp_path / "logs", workers=0, env=api_env) as stack:
        port = stack.url.rsplit(":", 1)[1]
        env = {k: v for k, v in os.environ.items() if k != "GLUEJOBS_API_KEY"}
        env |= {"GLUEJOBS_URL": stack.url, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"}
        failures = []
        for command in to_run:
            text = command.text.replace(f"localhost:{README_PORT}", f"localhost:{port}")
            run = subprocess.run(
                ["bash", "-c", PRELUDE + text],
                cwd=workspace,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if run.returncode != 0:
                failures.append(
                    f"{command.source}:{command.line}: {command.text}\n"
                    f"  → {run.returncode}: {run.stderr[-600:]}"
                )
    assert not failures, "\n".join(failures)
