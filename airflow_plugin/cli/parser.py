"""The parser: the global options, `--version`, and one sub-command per command module's `register`."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from . import exit_codes
from .commands import catalog, dags, jobs, observe, reconcile, retention, snapshots, upgrades
from .options import (
    CommandParser,
    add_global_options,
    apply_global_defaults,
    commands_taking,
    first_unknown_option,
    global_options,
    option_name,
)

DESCRIPTION = "Consistent, incremental, verified savepoints of Spark Structured Streaming checkpoints."
DISTRIBUTION = "spark-savepoints"


def package_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


class MainParser(argparse.ArgumentParser):
    """`savepoints`: the global options, then the command. An option before the command that is not a global one
    is refused, naming the commands that take it (pip's and kubectl's convention: global options before or after
    the command, a command's own options after it): argparse would skip it and read its value as the command."""

    option_commands: dict[str, list[str]] = {}
    command_parsers: dict[str, argparse.ArgumentParser] = {}

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        unknown = first_unknown_option(self, argv, up_to_command=True)
        if unknown is not None:
            self.error(self._misplaced(unknown, argv))
        return super().parse_known_args(argv, namespace)

    def _misplaced(self, unknown: str, argv: list[str]) -> str:
        name = unknown.split("=", 1)[0]
        commands = commands_taking(self.option_commands, unknown)
        if not commands:
            return f"unknown option {name} (the global options: {_global_options(self)}; `savepoints --help`)"
        where = f"{name} is an option of {', '.join(commands)} only, not a global one: give it after the command"
        at = argv.index(unknown)
        rest = argv[:at] + argv[at + 1 :]
        moved = [unknown]
        action = self.command_parsers[commands[0]]._option_string_actions[name]
        if "=" not in unknown and action.nargs != 0 and at < len(rest):
            moved.append(rest.pop(at))  # its value
        command = self._command(rest)
        if command in commands:
            return f"{where}: `{shlex.join([self.prog, *rest, *moved])}`"
        if command in self.command_parsers:
            return f"{where}; `{self.prog} {command}` does not take it"
        return where

    def _command(self, argv: list[str]) -> str | None:
        """The first word that is neither a global option nor one's value."""
        words = iter(argv)
        for word in words:
            name = option_name(word)
            if name is None:
                return word
            action = self._option_string_actions.get(name)
            if action is not None and action.nargs != 0 and "=" not in word:
                next(words, None)
        return None


def _global_options(parser: argparse.ArgumentParser) -> str:
    return ", ".join(
        "/".join(action.option_strings)
        for action in parser._actions
        if action.option_strings and not isinstance(action, argparse._HelpAction)
    )


def build_parser() -> argparse.ArgumentParser:
    parser = MainParser(
        prog="savepoints",
        description=DESCRIPTION,
        epilog=exit_codes.describe(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # `--job` before the command is not `--jobs`
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {package_version()}",
        help=f"print the version of {DISTRIBUTION} and exit",
    )
    add_global_options(parser)
    commands = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        parser_class=CommandParser,
        help="one of these (`savepoints COMMAND --help` lists its arguments)",
    )
    common = global_options()
    for module in (snapshots, jobs, retention, upgrades, reconcile, dags, catalog, observe):
        module.register(commands, common)
    _share_option_commands(parser, commands)
    return parser


def _share_option_commands(parser: MainParser, commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Each option that only some commands take, with those commands (the listed ones: not an old name), for the
    messages that refuse it elsewhere."""
    found: dict[str, list[str]] = {}
    for listed in commands._choices_actions:
        for option in commands.choices[listed.dest]._option_string_actions:
            if option not in parser._option_string_actions:  # not a global one, nor --help
                found.setdefault(option, []).append(listed.dest)
    parser.option_commands = found
    parser.command_parsers = dict(commands.choices)
    for command in commands.choices.values():
        command.option_commands = found


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with the global options' defaults where they were given neither before nor after the
    command."""
    return apply_global_defaults(build_parser().parse_args(argv))
