"""The exit codes, each once: what it means and the engine errors that end a command with it (matched by class,
the nearest base class first). The table is the exit code section of `savepoints --help` (`describe`) and of
docs/command-line.md (`markdown`; tests/cli/test_parser.py checks that the page holds it)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from ..core.errors import (
    BrokerUnavailable,
    CheckpointError,
    ClusterUnavailable,
    IntegrityError,
    InvalidInput,
    LaunchFailed,
    NotFound,
    Refused,
    SavepointsError,
    SparkToolFailed,
    StoreUnavailable,
    TimedOut,
    UpgradeFailed,
)

OK = 0
UNEXPECTED = 1
USAGE = 2  # also argparse's own exit code for a bad command line
VERIFY_FAILED = 6  # `verify` found problems: reported as data, not raised
INTERRUPTED = 130


@dataclass(frozen=True)
class ExitCode:
    code: int
    meaning: str
    errors: tuple[type[SavepointsError], ...] = ()


EXIT_CODES: tuple[ExitCode, ...] = (
    ExitCode(OK, "done"),
    ExitCode(UNEXPECTED, "unexpected error (run with `-v` for details)"),
    ExitCode(
        USAGE,
        "bad input or usage: a malformed URI, an invalid name, a bad label, an unknown option or command",
        (InvalidInput,),
    ),
    ExitCode(3, "not found: job, snapshot, checkpoint location, bucket", (NotFound,)),
    ExitCode(
        4,
        "refused to avoid losing or overwriting data: a non-empty restore target, a FAILED or IN_PROGRESS snapshot, "
        "a pinned snapshot, a sink that already holds the batches a restore or a fresh start would run (file sink "
        "or Delta table), Kafka offsets whose records are gone (or no broker to check them), an upgrade blocked by "
        "its pre-flight, another operation holding the job's lease; nothing was changed",
        (Refused,),
    ),
    ExitCode(
        5,
        "not a usable checkpoint: no `metadata`, no committed batch, files vanishing faster than they can be copied",
        (CheckpointError,),
    ),
    ExitCode(
        VERIFY_FAILED, "integrity: checksum mismatch, `verify` failed, corrupt or unsafe manifest", (IntegrityError,)
    ),
    ExitCode(
        7,
        "unreachable: the store (or its credentials missing or refused), a Kafka broker whose offsets must be "
        "checked, YARN's ResourceManager (or it refused a kill)",
        (StoreUnavailable, BrokerUnavailable, ClusterUnavailable),
    ),
    ExitCode(8, "a Spark tool failed (deep verify, rescale, a Delta sink's rewind, inspect, diff)", (SparkToolFailed,)),
    ExitCode(
        9,
        "a job could not be launched, or failed while starting (its Spark error or log tail is shown and kept in "
        "its status)",
        (LaunchFailed,),
    ),
    ExitCode(
        10,
        "timed out: a job did not stop in time (the stop request is withdrawn, the job keeps running, nothing is "
        "deleted), or a pre-started driver was not in STANDBY in time (it runs on: stop it or wait longer)",
        (TimedOut,),
    ),
    ExitCode(
        11,
        "an upgrade did not go through: aborted before its cutover (the old version runs on) or rolled back after "
        "it (`savepoints upgrade JOB --show`)",
        (UpgradeFailed,),
    ),
    ExitCode(INTERRUPTED, "interrupted (Ctrl-C)"),
)


def exit_code(exc: SavepointsError) -> int:
    """The exit code of an engine error: its class's, or the nearest base class's; 1 if none."""
    for cls in type(exc).__mro__:
        for row in EXIT_CODES:
            if cls in row.errors:
                return row.code
    return UNEXPECTED


def describe() -> str:
    """The exit code table for --help, each meaning wrapped under itself."""
    rows = (
        textwrap.fill(
            row.meaning,
            110,
            initial_indent=f"  {row.code:>3}  ",
            subsequent_indent=" " * 7,
            break_long_words=False,
            break_on_hyphens=False,
        )
        for row in EXIT_CODES
    )
    return "exit codes:\n" + "\n".join(rows)


def markdown() -> str:
    """The exit code table of docs/command-line.md."""
    rows = ["| exit code | meaning |", "| --- | --- |"]
    return "\n".join(rows + [f"| {row.code} | {row.meaning} |" for row in EXIT_CODES])
