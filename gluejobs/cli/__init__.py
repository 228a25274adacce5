"""The `gluejobs` command, on click: one module per resource, each with its group of commands.

- jobs: the job commands, at the top (`gluejobs submit`, `ls`, `show JOB`, `cancel`, `logs`,
  `metrics`, `download`, `resubmit`, `rerun`, `watch`) and `workers`
- sweeps: `sweep` (create, ls, show, cancel), `leaderboard`, `glue-zip`; searches: `search`
- checkpoints, files, models, keys (and `audit`), owners, webhooks: a group each
- serve, worker, migrate, demo: the server's own commands, which gluejobs-server brings
  (server_parts: found through its entry points, or a line saying what to install)

The client commands read GLUEJOBS_URL and GLUEJOBS_API_KEY. Every error is one line on stderr,
`gluejobs <command>: <message>`, with exit status 2 (a refused command line raises SystemExit(2), as
argparse did); a closed pipe (`gluejobs ls | head`) ends quietly, Ctrl-C with 130.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from gluejobs.cli import checkpoints, files, jobs, keys, models, owners, searches, sweeps, webhooks
from gluejobs.cli.base import CliError, Group, usage_line
from gluejobs.cli.output import closed_pipe, print_error
from gluejobs.cli.server_parts import server_commands
from gluejobs.client import ApiError

SERVER_COMMANDS = ("serve", "worker", "migrate")


class Gluejobs(Group):
    """The top group: where a command's error becomes its one line, and where the server's commands
    join the client's (a client command's name is never looked up among them)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *server_commands()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, cmd_name) or server_commands().get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (CliError, ApiError) as exc:
            print_error(ctx.invoked_subcommand or "", exc)
            return 2
        except BrokenPipeError:  # `gluejobs ls | head`: the reader has what it wanted
            return closed_pipe()
        except KeyboardInterrupt:
            return 130


@click.group("gluejobs", cls=Gluejobs, context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def gluejobs(ctx: click.Context) -> None:
    """GLUE fine-tuning jobs as a REST service. `gluejobs COMMAND --help` says more of each."""
    # Servers log what they do; client commands print only their own lines.
    level = logging.INFO if ctx.invoked_subcommand in SERVER_COMMANDS else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


for module in (jobs, checkpoints, sweeps, searches, files, models, keys, owners, webhooks):
    for command in module.COMMANDS:
        gluejobs.add_command(command)


def main(argv: list[str] | None = None) -> int:
    """`gluejobs …`: the exit status. A command line the command refuses raises SystemExit(2)."""
    try:
        return int(gluejobs.main(argv, prog_name="gluejobs", standalone_mode=False) or 0)
    except click.UsageError as exc:
        print(usage_line(exc), file=sys.stderr)
        raise SystemExit(2) from None
    except click.Abort:  # Ctrl-C while click itself was reading the command line
        return 130
