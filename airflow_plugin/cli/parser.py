"""The parser: the global options, `--version`, and one sub-command per command module's `register`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from . import exit_codes
from .commands import catalog, dags, jobs, observe, reconcile, retention, snapshots, upgrades
from .options import CommandParser, add_global_options, apply_global_defaults, global_options

DESCRIPTION = "Consistent, incremental, verified savepoints of Spark Structured Streaming checkpoints."
DISTRIBUTION = "spark-savepoints"


def package_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    return parser


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with the global options' defaults where they were given neither before nor after the
    command."""
    return apply_global_defaults(build_parser().parse_args(argv))
