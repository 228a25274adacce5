"""What every `gluejobs` command shares, on click.

Why click (rather than typer, or argparse as before): click is the mature base that typer itself
wraps; it reads no type hints and brings no further dependency into the client's light wheel; and it
lets `gluejobs submit` take a script's command line as pasted: with `ignore_unknown_options` and an
UNPROCESSED `nargs=-1` argument, every word it does not know is kept, in order, for
gluejobs.cli.script_args to translate, while the command's own options (--dry-run, --url …) are still
recognised anywhere on the line.

- `Command` and `Group` refuse what they do not know in one line and in the words the command used
  before it moved to click (argparse's: `gluejobs ls: unrecognized arguments: --stauts queued; did you
  mean --status?`), which its users and tests know.
- `ClientCommand`: a command that talks to the API. It has --url, --api-key and, where the answer
  has a JSON form, --json, and hands them to its function as one `Invocation`, whose `show` prints
  either the API's answer as one JSON document or the lines for people: --json lives here alone.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import click

from gluejobs.cli.output import print_json
from gluejobs.client import DEFAULT_URL, Client, RetryPolicy
from shared.jobspec.suggest import did_you_mean

# A person at a terminal would rather hear at once that nobody is listening, but an API that answers
# 503 (its database away) or 429 is waited for, as long as it asks (Retry-After), with backoff.
CLI_RETRIES = RetryPolicy(connect_retries=2)


class CliError(Exception):
    """A problem the user can fix; printed as the command's one error line, without a traceback."""


# ---------------------------------------------------------------------------------------------------
# Commands that refuse in one line
# ---------------------------------------------------------------------------------------------------


class _OneLineRefusals:
    """parse_args of a command or group, with an unknown option refused as argparse worded it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        words = list(args)  # click's parser takes its words off `args` as it goes
        try:
            rest: list[str] = super().parse_args(ctx, args)  # type: ignore[misc]
        except click.NoSuchOption as exc:
            raise click.UsageError(_unrecognized(words, exc.option_name, _options(ctx)), ctx) from None
        return rest


class Command(_OneLineRefusals, click.Command):
    """A gluejobs command: its extra words are refused by name (not as click's "Got unexpected extra
    argument"), so it lets click keep them for a moment (allow_extra_args)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["context_settings"] = {"allow_extra_args": True, **(kwargs.get("context_settings") or {})}
        super().__init__(*args, **kwargs)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        if ctx.args:
            raise click.UsageError(_unrecognized(ctx.args, None, _options(ctx)), ctx)
        return rest


class Group(_OneLineRefusals, click.Group):
    """A group of gluejobs commands (`@group.command()` makes a Command)."""

    command_class = Command

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # A group named alone is a mistake said in one line, as any other (not a screen of help).
        kwargs.setdefault("no_args_is_help", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args:
            ctx.fail("the following arguments are required: command")
        return super().parse_args(ctx, args)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0]
        if self.get_command(ctx, name) is None and not name.startswith("-"):
            names = self.list_commands(ctx)
            ctx.fail(
                f"argument command: invalid choice: {name!r} (choose from {', '.join(map(repr, names))})"
                + did_you_mean(name, names)
            )
        return super().resolve_command(ctx, args)


class DefaultGroup(Group):
    """A group one of whose commands may go unnamed: `gluejobs sweep <the script's flags>` is
    `gluejobs sweep create <the script's flags>` (the README's and its users' way)."""

    def __init__(self, *args: Any, default: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.default = default

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = [self.default, *args]
        return super().parse_args(ctx, args)


class Choice(click.Choice):
    """click's Choice, refusing as argparse did, with the near match: "invalid choice: 'runing'
    (choose from 'queued', …); did you mean 'running'?"."""

    def get_invalid_choice_message(self, value: Any, ctx: click.Context | None) -> str:
        names = [str(choice) for choice in self.choices]
        return f"invalid choice: {value!r} (choose from {', '.join(map(repr, names))})" + did_you_mean(
            str(value), names
        )


def usage_line(exc: click.UsageError) -> str:
    """`gluejobs <command>: <message> (see `gluejobs <command> --help`)`: a refused command line."""
    path = exc.ctx.command_path if exc.ctx is not None else "gluejobs"
    message = exc.message
    if isinstance(exc, click.BadParameter) and exc.param is not None:
        name = (
            "/".join(exc.param.opts) if isinstance(exc.param, click.Option) else exc.param.human_readable_name
        )
        missing = isinstance(exc, click.MissingParameter)
        message = (
            f"the following arguments are required: {name}" if missing else f"argument {name}: {message}"
        )
    return f"{path}: {message} (see `{path} --help`)"


def _options(ctx: click.Context) -> list[str]:
    return [name for param in ctx.command.get_params(ctx) for name in (*param.opts, *param.secondary_opts)]


def _unrecognized(words: list[str], option: str | None, options: list[str]) -> str:
    """argparse's words for what a command does not take: the unknown option (or the extra words)
    and the values after it, with the near match of the option."""
    start = next((i for i, word in enumerate(words) if word.partition("=")[0] == option), None)
    if start is None:
        shown = [option] if option else list(words)
    else:
        end = next((i for i in range(start + 1, len(words)) if words[i].startswith("-")), len(words))
        shown = words[start:end]
    flag = option or next((word for word in shown if word.startswith("-")), None)
    hint = did_you_mean(flag.partition("=")[0], options, quote=False) if flag else ""
    return f"unrecognized arguments: {' '.join(shown)}{hint}"


# ---------------------------------------------------------------------------------------------------
# Client commands: --url, --api-key, --json
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Invocation:
    """A client command as called: where the API is, the key, and whether the answer is wanted as JSON."""

    url: str
    api_key: str
    json: bool

    def client(self, *, retries: int | RetryPolicy = CLI_RETRIES) -> Client:
        return Client(self.url, api_key=self.api_key, retries=retries)

    def show(self, raw: Any, lines: str | Iterable[str]) -> None:
        """--json: `raw` (the API's answer) as one JSON document, so `| jq` and json.loads read it
        whole; otherwise the lines for people."""
        if self.json:
            print_json(raw)
        else:
            print(lines if isinstance(lines, str) else "\n".join(lines))


class ClientCommand(Command):
    """A command that talks to the API; its function takes an Invocation first, then its own
    parameters. `json`: what --json prints (no --json when the answer has no JSON form)."""

    def __init__(self, *args: Any, json: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params += [
            click.Option(
                ["--url"],
                envvar="GLUEJOBS_URL",
                default=DEFAULT_URL,
                show_default=True,
                help="The API's base URL (or GLUEJOBS_URL).",
            ),
            click.Option(
                ["--api-key"],
                envvar="GLUEJOBS_API_KEY",
                help="A bearer key, if the API needs one (or GLUEJOBS_API_KEY).",
            ),
        ]
        if json is not None:
            self.params.append(
                click.Option(["--json"], is_flag=True, help=f"Print {json} as one JSON document.")
            )

    def invoke(self, ctx: click.Context) -> Any:
        params = dict(ctx.params)
        invocation = Invocation(
            url=params.pop("url"), api_key=params.pop("api_key") or "", json=params.pop("json", False)
        )
        assert self.callback is not None
        return ctx.invoke(self.callback, invocation, **params)


# ---------------------------------------------------------------------------------------------------
# Values of options
# ---------------------------------------------------------------------------------------------------


def json_or_text(text: str) -> Any:
    """A value typed on the command line: JSON where it parses (3, 2e-5, true, null, [..]), else text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def key_values(option: str, items: Iterable[str]) -> dict[str, str]:
    """`--metadata team=nlp` (repeated) as a dict; anything but KEY=VALUE is refused by name."""
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"{option} takes KEY=VALUE, not {item!r}")
        pairs[key] = value
    return pairs


def job_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """--priority, --max-attempts and --metadata: what a command that queues jobs sends beside the spec."""
    for option in reversed(
        (
            click.option(
                "--priority",
                type=int,
                default=0,
                show_default=True,
                help="The job's priority: higher is claimed sooner.",
            ),
            click.option(
                "--max-attempts",
                type=int,
                default=3,
                show_default=True,
                help="Attempts before the job counts as failed.",
            ),
            click.option(
                "--metadata",
                multiple=True,
                metavar="KEY=VALUE",
                help="A label kept with the job (repeatable).",
            ),
        )
    ):
        function = option(function)
    return function


@contextmanager
def script_flags() -> Iterator[None]:
    """A script's flag that gluejobs.cli.script_args refuses, as the command's one error line. Imported
    here, by the commands that translate flags, so that no other command loads the spec (pydantic)."""
    from gluejobs.cli.script_args import ScriptArgsError

    try:
        yield
    except ScriptArgsError as exc:
        raise CliError(str(exc)) from exc


def note(line: str) -> None:
    """A line beside the answer (what was uploaded, a flag's meaning here), on stderr."""
    print(line, file=sys.stderr)
