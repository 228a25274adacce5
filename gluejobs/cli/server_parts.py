"""serve, worker, migrate, demo: the server's commands, which come with gluejobs-server.

They live in the server's distribution (gluejobs_server/commands.py), so this client imports nothing
of service/, worker/ or shared/'s database: gluejobs-server declares them as entry points of the group
GROUP (server/pyproject.toml), and the `gluejobs` group adds what is installed. It reads the installed
distributions' metadata only when a command line names a command that is not the client's own, or asks
for the list (--help): `gluejobs ls` does not pay for the scan.

On a machine with the client alone (`pip install gluejobs`), each of them is still a command that says
in one line what to install. An entry point that fails to load is named in a warning and its command
says why; the client's commands work on.
"""

from __future__ import annotations

import functools
import importlib.metadata
import sys
from collections.abc import Iterable

import click

from gluejobs.cli.base import CliError, Command

GROUP = "gluejobs.commands"
# The server's commands on a machine with the client alone: the line that installs each, and what
# `gluejobs --help` says of it there.
SERVER_PARTS = {
    "serve": ("pip install gluejobs-server", "Run the HTTP API (comes with gluejobs-server)."),
    "worker": (
        'pip install "gluejobs-server[worker]" (docs/operators/install.md: CPU or CUDA torch)',
        "Claim and run jobs (comes with gluejobs-server[worker]).",
    ),
    "migrate": (
        "pip install gluejobs-server",
        "Bring the database schema up to date (comes with gluejobs-server).",
    ),
    "demo": (
        'pip install "gluejobs-server[demo]"',
        "Fine-tune MiniLM on a small dataset, here (comes with gluejobs-server[demo]).",
    ),
}
# A stand-in takes whatever flags the real command would (`gluejobs serve --port 80` says what to
# install, not that --port is unknown).
ANY_FLAGS = {"ignore_unknown_options": True}


def _stand_in(name: str, summary: str, error: str) -> click.Command:
    """A command `name` whose help is `summary` and which ends with the one line `error`."""

    @click.command(name, cls=Command, help=summary, context_settings=ANY_FLAGS)
    @click.argument("flags", nargs=-1, type=click.UNPROCESSED)
    def stand_in(flags: tuple[str, ...]) -> int:
        raise CliError(error)

    return stand_in


def commands_from(entries: Iterable[importlib.metadata.EntryPoint]) -> dict[str, click.Command]:
    """The commands `entries` name, loaded, and a stand-in for each of SERVER_PARTS none provides.
    One that fails to load is warned of on stderr, by name, and stands in as a command saying why."""
    found: dict[str, click.Command] = {}
    for entry in entries:
        owner = entry.dist.name if entry.dist is not None else "its distribution"
        try:
            command = entry.load()
            if not isinstance(command, click.Command):
                raise TypeError(f"{type(command).__name__} is not a click command")
        except Exception as exc:  # a broken install must not take the client's commands with it
            why = f"{entry.name} = {entry.value} (of {owner}) did not load: {type(exc).__name__}: {exc}"
            print(f"gluejobs: warning: the command {why}", file=sys.stderr)
            found[entry.name] = _stand_in(
                entry.name, f"Did not load (of {owner}).", f"{why}; reinstall {owner}"
            )
            continue
        found[entry.name] = command
    for name, (install, summary) in SERVER_PARTS.items():
        if name not in found:
            found[name] = _stand_in(
                name,
                summary,
                f"this machine has the gluejobs client only (gluejobs-server missing): {install}",
            )
    return found


@functools.cache
def server_commands() -> dict[str, click.Command]:
    """The installed server's commands (or their stand-ins), read once a process."""
    return commands_from(importlib.metadata.entry_points(group=GROUP))
