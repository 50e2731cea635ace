"""The parsers of hvdtrain's command line: a mistake is one line and exit status 2, and a
subcommand's options are added by its module when that subcommand is the one used."""
from __future__ import annotations

import argparse
from types import ModuleType
from typing import Any

from hvdtrain.errors import UserError


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise UserError: one line, exit 2, from rank 0 only."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{message} (see '{self.prog} --help')", shared=True)


class CommandParser(Parser):
    """A subcommand's parser, completed by its module (``add_arguments``, then ``func`` set to
    its ``run``) the first time it parses or shows its help. Building every subcommand's
    options up front would import what each needs (the benchmarks, for bench) on every
    rank that only trains."""

    def __init__(self, *args: Any, command: ModuleType, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._command: ModuleType | None = command

    def _complete(self) -> None:
        if self._command is not None:
            command, self._command = self._command, None
            command.add_arguments(self)
            self.set_defaults(func=command.run)

    def parse_known_args(self, args=None, namespace=None):
        self._complete()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._complete()
        return super().format_usage()

    def format_help(self) -> str:
        self._complete()
        return super().format_help()


def add_commands(parser: argparse.ArgumentParser, commands: tuple[ModuleType, ...]) -> None:
    """One subcommand of ``parser`` per module of ``commands``, in their order: each module
    has NAME, HELP (its line in the parent's --help), add_arguments(parser) and
    run(args) -> exit status, which lands in ``args.func``."""
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    for command in commands:
        sub.add_parser(command.NAME, help=command.HELP, command=command)
