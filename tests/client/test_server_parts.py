"""The server's commands in the client's `gluejobs`: found through gluejobs-server's "gluejobs.commands"
entry points when it is installed (as here), a one-line stand-in for each when it is not, and a warning
by name for one that does not load (tests/project/test_packaging.py runs the same on a command line)."""

from __future__ import annotations

import importlib.metadata

import click
import pytest

from gluejobs.cli import gluejobs, main
from gluejobs.cli.base import CliError
from gluejobs.cli.server_parts import GROUP, SERVER_PARTS, commands_from, server_commands


def test_the_installed_server_brings_its_own_commands() -> None:
    installed = server_commands()
    assert set(SERVER_PARTS) <= installed.keys()
    for name in SERVER_PARTS:
        command = gluejobs.get_command(click.Context(gluejobs), name)
        assert command is installed[name] and command.callback is not None
        assert command.callback.__module__ == "gluejobs_server.commands", name
    assert set(SERVER_PARTS) <= set(gluejobs.list_commands(click.Context(gluejobs)))


def test_a_client_command_is_never_looked_up_among_the_servers() -> None:
    ctx = click.Context(gluejobs)
    assert gluejobs.get_command(ctx, "ls") is gluejobs.commands["ls"]
    assert gluejobs.get_command(ctx, "no-such-command") is None


@pytest.mark.parametrize("name", sorted(SERVER_PARTS))
def test_without_the_server_each_command_says_what_to_install(name: str) -> None:
    stand_in = commands_from([])[name]
    assert stand_in.help and "gluejobs-server" in stand_in.help
    with pytest.raises(CliError) as refused:
        stand_in.main([name, "--port", "8000"], standalone_mode=False)  # the real command's flags too

    install = SERVER_PARTS[name][0]
    assert (
        str(refused.value)
        == f"this machine has the gluejobs client only (gluejobs-server missing): {install}"
    )


def test_an_entry_point_that_does_not_load_is_named_and_the_others_load(
    capsys: pytest.CaptureFixture[str],
) -> None:
    entries = [
        importlib.metadata.EntryPoint(name="serve", value="gluejobs_server.nowhere:serve", group=GROUP),
        importlib.metadata.EntryPoint(name="migrate", value="gluejobs_server.commands:NEEDS", group=GROUP),
        importlib.metadata.EntryPoint(name="worker", value="gluejobs_server.commands:worker", group=GROUP),
    ]
    found = commands_from(entries)

    warned = capsys.readouterr().err.splitlines()
    assert warned == [
        "gluejobs: warning: the command serve = gluejobs_server.nowhere:serve (of its distribution) did not "
        "load: ModuleNotFoundError: No module named 'gluejobs_server.nowhere'",
        "gluejobs: warning: the command migrate = gluejobs_server.commands:NEEDS (of its distribution) did "
        "not load: TypeError: dict is not a click command",
    ]
    assert (
        found["worker"].callback is not None
        and found["worker"].callback.__module__ == "gluejobs_server.commands"
    )
    with pytest.raises(
        CliError, match=r"^serve = gluejobs_server.nowhere:serve .* did not load: .*; reinstall"
    ):
        found["serve"].main([], standalone_mode=False)
    with pytest.raises(CliError, match="client only"):  # none of them named demo: its stand-in
        found["demo"].main([], standalone_mode=False)


def test_the_commands_help_is_listed_with_the_clients(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    listed = capsys.readouterr().out.split("Commands:")[1]
    for name in ("serve", "worker", "migrate", "demo", "submit"):
        assert f"\n  {name} " in listed, listed
