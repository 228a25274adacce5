"""argparse for `gluejobs`, with its errors in the command's one-line format and the near match of a
mistyped option or choice (argparse suggests nothing before Python 3.14)."""

from __future__ import annotations

import argparse
import re
import sys
from typing import NoReturn

from shared.suggest import did_you_mean

_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)")


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser (and, through add_subparsers, each command's) whose error is one line,
    `gluejobs <command>: <message>`, as every other error of the command is."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: {message}{self._hint(message)} (see `{self.prog} --help`)\n")
        raise SystemExit(2)

    def _hint(self, message: str) -> str:
        choice = _CHOICE.search(message)
        if choice is not None:
            choices = [c.strip().strip("'") for c in choice["choices"].split(",")]
            return did_you_mean(choice["given"], choices)
        if message.startswith("unrecognized arguments: "):
            flag = next((w for w in message.split()[2:] if w.startswith("-")), None)
            if flag is not None:
                # argparse keeps its options in a private list; there is no public one to ask.
                options = [o for action in self._actions for o in action.option_strings]
                return did_you_mean(flag.partition("=")[0], options, quote=False)
        return ""
