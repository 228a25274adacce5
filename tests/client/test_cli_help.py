"""The command line on click (issue 24, item 4): `gluejobs X --help` for every command, help text for
every command and option, a script's flags passed through `submit` as pasted, refusals in one line,
and one date format."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import click
import pytest

from gluejobs.cli import gluejobs, main
from gluejobs.cli.output import when

# Their flags, --help included, are service/'s and worker/'s own parsers'.
FORWARDING = {("serve",), ("worker",)}


def command_paths(group: click.Group = gluejobs, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    ctx = click.Context(group)
    found = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        found.append((*path, name))
        if isinstance(command, click.Group):
            found += command_paths(command, (*path, name))
    return found


def command_at(path: tuple[str, ...]) -> click.Command:
    command: click.Command = gluejobs
    for name in path:
        assert isinstance(command, click.Group)
        found = command.get_command(click.Context(command), name)
        assert found is not None
        command = found
    return command


def test_the_command_tree_holds_every_command_the_readme_and_design_name() -> None:
    paths = {" ".join(path) for path in command_paths()}
    assert {
        "serve", "worker", "migrate", "demo", "submit", "ls", "workers", "show", "cancel", "logs",
        "metrics", "download", "resubmit", "rerun", "watch", "sweep", "sweep create", "sweep ls",
        "sweep show", "sweep cancel", "leaderboard", "glue-zip", "search create", "search ls",
        "search show", "search cancel", "search seeds", "files ls", "files upload", "files rm",
        "models upload", "models ls", "models rm", "keys create", "keys ls", "keys revoke",
        "keys rotate", "audit", "owners ls", "owners set", "webhooks create", "webhooks ls",
        "webhooks show", "webhooks rm", "webhooks rotate", "webhooks test", "webhooks enable",
        "webhooks disable", "webhooks deliveries", "models promote", "checkpoints ls", "checkpoints prune",
    } <= paths  # fmt: skip


@pytest.mark.parametrize("path", [p for p in command_paths() if p not in FORWARDING], ids=" ".join)
def test_every_command_has_help_and_every_option_says_what_it_does(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*path, "--help"])

    out = capsys.readouterr().out
    assert code == 0 and out.startswith(f"Usage: gluejobs {' '.join(path)} "), out
    command = command_at(path)
    assert command.help and " ".join(command.get_short_help_str(limit=62).split()) in " ".join(out.split())
    for param in command.params:
        if isinstance(param, click.Option):
            assert param.help, f"gluejobs {' '.join(path)} {param.opts[0]} has no help"


@pytest.mark.parametrize("name", ["serve", "worker"])
def test_serve_and_worker_hand_their_help_to_their_own_parsers(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert command_at((name,)).help
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])

    assert exit_.value.code == 0 and "--no-migrate" in capsys.readouterr().out


def test_submit_takes_its_own_options_anywhere_and_passes_the_rest_through(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """submit's options (--dry-run, --json, --url) between the script's flags, which reach the
    spec in their order: a flag given twice keeps its last value, as the scripts' argparse does."""
    argv = ["submit", "--model_name_or_path", "m", "--dry-run", "--seed", "1", "--task_name", "sst2"]
    code = main([*argv, "--json", "--seed", "7", "--url", "http://127.0.0.1:9"])

    out, err = capsys.readouterr()
    assert code == 0, err
    planned = json.loads(out)
    assert planned["dry_run"] is True and planned["spec"]["task_name"] == "sst2"
    assert planned["spec"]["seed"] == 7 and "cannot reach the API at http://127.0.0.1:9" in err


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        pytest.param(
            ["keys", "craete", "bob"],
            "gluejobs keys: argument command: invalid choice: 'craete' (choose from",
            id="group's command",
        ),
        pytest.param(["show"], "gluejobs show: the following arguments are required: JOB", id="missing"),
        pytest.param(["show", "3", "4"], "gluejobs show: unrecognized arguments: 4", id="extra"),
        pytest.param(
            ["owners", "set", "bob", "--share", "x"],
            "gluejobs owners set: argument --share: 'x' is not a number (or 'default')",
            id="value",
        ),
        pytest.param(
            ["owners", "set", "bob"], "gluejobs owners set: give at least one of --share", id="nothing set"
        ),
        pytest.param(["files"], "gluejobs files: the following arguments are required: command", id="group"),
    ],
)
def test_a_refused_command_line_is_one_line_naming_the_command(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)

    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(line) and len(err.strip().splitlines()) == 1, err
    command = line.partition(":")[0]
    assert err.rstrip().endswith(f"(see `{command} --help`)"), err


def test_one_date_format_iso_8601_utc() -> None:
    berlin = timezone(timedelta(hours=1))
    assert when(datetime(2026, 3, 1, 15, 5, 9, 250_000, tzinfo=berlin)) == "2026-03-01T14:05:09Z"
    assert when(datetime(2026, 3, 1, 14, 5, 9, tzinfo=UTC)) == "2026-03-01T14:05:09Z"
    assert when(datetime(2026, 3, 1, 14, 5, 9)) == "2026-03-01T14:05:09Z"  # the API's moments are UTC
    assert when(None) == "-"
