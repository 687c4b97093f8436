"""What the commands' parsers share: the global options (taken before or after the command), the options that
only the commands they act on take (the Kafka broker, parallel transfers), and the job argument (JOB, the same
in every command; the `--job JOB` of the commands that had it still works, with a note that it is deprecated).

A global option given both before and after the command: the one after it wins, as when any option is given
twice (the last one wins). An option a command does not take is refused before anything is parsed, naming it and
where it belongs: argparse would skip it and take its value as a positional (the job, or the command)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any

from ..core.jobs.context import KAFKA_ENV, STORE_ENV
from ..core.jobs.spec import JOBS_ENV
from ..core.parallel import DEFAULT_CONCURRENCY
from .render import note

GLOBAL_TITLE = "global options (before or after the command; given in both places, the one after it wins)"
GLOBAL_DEFAULTS: dict[str, Any] = {"jobs": None, "store": None, "json": False, "verbose": False}
JOB_HELP = "the job: one the jobs file declares, or any name for the snapshots of a checkpoint"
OLD_JOB_OPTION = "--job"
NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse reads these as values, not options


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """--jobs, --store, --json, -v: on the main parser and on every command's. Their defaults are filled in
    after parsing (`apply_global_defaults`): a default on the command's parser would hide the value given
    before the command."""
    group = parser.add_argument_group(GLOBAL_TITLE)
    group.add_argument(
        "--jobs",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help=f"the jobs file (default ${JOBS_ENV}, else ./jobs.toml)",
    )
    group.add_argument(
        "--store",
        metavar="URI",
        default=argparse.SUPPRESS,
        help=f"snapshot store: s3://bucket/prefix or a path (default ${STORE_ENV}, else the jobs file's store)",
    )
    group.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    group.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log what happens")


def global_options() -> argparse.ArgumentParser:
    """The global options as a parent of every command's parser."""
    common = argparse.ArgumentParser(add_help=False)
    add_global_options(common)
    return common


def apply_global_defaults(args: argparse.Namespace) -> argparse.Namespace:
    for name, default in GLOBAL_DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, default)
    return args


def add_kafka_option(parser: argparse.ArgumentParser) -> None:
    """For the commands that check snapshots' Kafka offsets against the broker (or hand it to a driver)."""
    parser.add_argument(
        "--kafka-bootstrap",
        metavar="HOST:PORT",
        help=f"the Kafka broker whose offsets are checked (default ${KAFKA_ENV}, else the job's kafka table)",
    )


def add_concurrency_option(parser: argparse.ArgumentParser) -> None:
    """For the commands that copy files to or from the store."""
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        metavar="N",
        help=f"parallel transfers to or from the store (default {DEFAULT_CONCURRENCY})",
    )


def add_job(
    parser: argparse.ArgumentParser,
    help: str = JOB_HELP,
    *,
    optional: bool = False,
    many: bool = False,
    was_option: bool = False,
) -> None:
    """The positional JOB (optional: JOB may be left out; many: any number of them). `was_option`: the command
    took `--job JOB` before; it still does, with a note on stderr (CommandParser)."""
    nargs = "*" if many else "?" if optional else None
    extra: dict[str, Any] = {"default": []} if many else {}
    action = parser.add_argument("job", metavar="JOB", nargs=nargs, help=help, **extra)
    if isinstance(parser, CommandParser):
        parser.job_argument = action
        parser.job_was_option = was_option


def option_name(token: str) -> str | None:
    """The option a word of the command line names (`--store=x`: `--store`; `-vh`: `-v`), or None for a word
    argparse reads as a value: `-`, `--`, a negative number."""
    if token in ("-", "--") or not token.startswith("-") or NEGATIVE_NUMBER.match(token):
        return None
    return token.split("=", 1)[0] if token.startswith("--") else token[:2]


def takes(parser: argparse.ArgumentParser, name: str) -> bool:
    """Whether argparse would read `name` as one of this parser's options (an abbreviation where it allows them:
    argparse itself then says if it is ambiguous)."""
    if name in parser._option_string_actions:
        return True
    return (
        parser.allow_abbrev and name.startswith("--") and any(s.startswith(name) for s in parser._option_string_actions)
    )


def first_unknown_option(
    parser: argparse.ArgumentParser, argv: Sequence[str], *, up_to_command: bool = False
) -> str | None:
    """The first word of argv (up to a `--`) that names an option this parser does not take. `up_to_command`:
    the main parser's words, before the first positional (the command), its own options' values skipped."""
    tokens = iter(argv)
    for token in tokens:
        name = option_name(token)
        if token == "--" or (up_to_command and name is None):
            return None
        if name is None or (" " in token and not takes(parser, name)):  # argparse: a word with a space is a value
            continue
        if not takes(parser, name):
            return token
        action = parser._option_string_actions.get(name)
        if up_to_command and action is not None and action.nargs != 0 and "=" not in token:
            next(tokens, None)  # its value, not the command
    return None


def commands_taking(option_commands: dict[str, list[str]], token: str) -> list[str]:
    """The commands that take the option `token` names (`--store=x`: `--store`)."""
    return option_commands.get(token.split("=", 1)[0], [])


class CommandParser(argparse.ArgumentParser):
    """A command's parser. Of a command whose job was `--job JOB`, it takes that form too: a note says it is
    deprecated, and a job given both ways, differently, is a usage error. Of a renamed command (`renamed_to`),
    a note names the new name."""

    job_argument: argparse.Action | None = None
    job_was_option = False
    renamed_to: str | None = None
    option_commands: dict[str, list[str]] = {}  # an option of some commands only: those commands (parser.py)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """As argparse's, and an argument this command does not take is an error of this command (its usage,
        not the main parser's)."""
        if self.renamed_to:
            note(f"`{self.prog}` is deprecated: it is now `{self._name()}`")
        argv = list(sys.argv[1:] if args is None else args)
        self._refuse_unknown_option(argv)
        rest, old = self._pull_old_job_option(argv)
        if self.job_argument is None or not old:
            parsed, extras = super().parse_known_args(argv, namespace)
        elif not self.job_was_option:
            self.error(f"{OLD_JOB_OPTION} is not an option of this command: give the job as JOB: {self._usage()}")
        else:
            parsed, extras = self._parse_with_old_job_option(rest, old, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)} (`{self._name()} --help` lists what it takes)")
        return parsed, extras

    def _refuse_unknown_option(self, argv: list[str]) -> None:
        """An option this command does not take is an error naming it, before argparse could take the word after
        it as JOB or ID. `--job` is left to `_pull_old_job_option`."""
        words = argv if self.job_argument is None else [w for w in argv if option_name(w) != OLD_JOB_OPTION]
        unknown = first_unknown_option(self, words)
        if unknown is None:
            return
        name = unknown.split("=", 1)[0]
        elsewhere = commands_taking(self.option_commands, unknown)
        if elsewhere:
            self.error(
                f"{name} is not an option of `{self._name()}`: only {', '.join(elsewhere)} "
                f"{'takes' if len(elsewhere) == 1 else 'take'} it (`{self._name()} --help` lists its options)"
            )
        self.error(f"unknown option {name}: `{self._name()}` takes {self._options()} (`{self._name()} --help`)")

    def _options(self) -> str:
        """This command's options, then the global ones: `--kafka-bootstrap and the global options --jobs, ...`."""
        own: list[str] = []
        common: list[str] = []
        for action in self._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            names = "/".join(action.option_strings)
            (common if action.dest in GLOBAL_DEFAULTS else own).append(names)
        return (f"{', '.join(own)} and " if own else "") + f"the global options {', '.join(common)}"

    def _pull_old_job_option(self, argv: list[str]) -> tuple[list[str], list[str]]:
        """argv without `--job VALUE` and `--job=VALUE` (up to a `--`), and those values."""
        rest: list[str] = []
        values: list[str] = []
        tokens = iter(argv)
        for token in tokens:
            if token == "--":
                rest += [token, *tokens]
                break
            if token == OLD_JOB_OPTION:
                value = next(tokens, None)
                if value is None:
                    self.error(f"argument {OLD_JOB_OPTION}: expected one argument")
                values.append(value)
            elif token.startswith(OLD_JOB_OPTION + "="):
                values.append(token.split("=", 1)[1])
            else:
                rest.append(token)
        return rest, values

    def _parse_with_old_job_option(
        self, rest: list[str], old: list[str], namespace: argparse.Namespace | None
    ) -> tuple[argparse.Namespace, list[str]]:
        action = self.job_argument
        assert action is not None
        many = action.nargs == "*"
        if not many and len(set(old)) > 1:
            self.error(f"{OLD_JOB_OPTION} given twice, differently ({', '.join(old)}): give one job, as JOB")
        saved = action.nargs, action.required
        action.nargs, action.required = ("*" if many else "?"), False  # JOB may be missing: --job gives it
        try:
            parsed, extras = super().parse_known_args(rest, namespace)
        finally:
            action.nargs, action.required = saved
        given = getattr(parsed, action.dest)
        wanted: Any = old if many else old[0]
        if given is None or given == []:
            setattr(parsed, action.dest, wanted)
        elif given != wanted:
            self.error(
                f"the job is given twice, differently: JOB {' '.join(given) if many else given} and "
                f"{OLD_JOB_OPTION} {' '.join(old)}: give it once, as JOB"
            )
        note(f"`{OLD_JOB_OPTION} JOB` is deprecated: give the job as the argument JOB: `{self._usage()}`")
        return parsed, extras

    def _name(self) -> str:
        """`savepoints COMMAND`, by its current name."""
        return f"{self.prog.rsplit(' ', 1)[0]} {self.renamed_to}" if self.renamed_to else self.prog

    def _usage(self) -> str:
        """The command with its positional arguments: `savepoints show JOB ID`."""
        words = [self._name()]
        for action in self._get_positional_actions():
            name = action.metavar if isinstance(action.metavar, str) else action.dest
            if action.metavar is None and action.choices:
                name = "{" + ",".join(map(str, action.choices)) + "}"
            words.append({"?": f"[{name}]", "*": f"[{name} ...]"}.get(str(action.nargs), name))
        return " ".join(words)
