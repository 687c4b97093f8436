"""The parser: the options every command shares, and one sub-command per command module's `register`."""

from __future__ import annotations

import argparse

from ..core.context import KAFKA_ENV, STORE_ENV
from ..core.jobs.spec import JOBS_ENV
from ..core.parallel import DEFAULT_CONCURRENCY
from . import exit_codes
from .commands import catalog, dags, jobs, observe, retention, snapshots, upgrades

DESCRIPTION = "Consistent, incremental, verified savepoints of Spark Structured Streaming checkpoints."


def shared_options() -> argparse.ArgumentParser:
    """Options every command takes (argparse parents)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--jobs", metavar="FILE", help=f"the jobs file (default ${JOBS_ENV}, else ./jobs.toml)")
    common.add_argument(
        "--store",
        metavar="URI",
        help=f"snapshot store: s3://bucket/prefix or a path (default ${STORE_ENV}, else the jobs file's store)",
    )
    common.add_argument(
        "--kafka-bootstrap",
        metavar="HOST:PORT",
        help=f"the Kafka broker whose offsets are checked (default ${KAFKA_ENV}, else the job's kafka table)",
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    common.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help=f"parallel transfers (default {DEFAULT_CONCURRENCY})",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="savepoints",
        description=DESCRIPTION,
        epilog=exit_codes.describe(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = shared_options()
    for module in (snapshots, jobs, retention, upgrades, dags, catalog, observe):
        module.register(commands, common)
    return parser
