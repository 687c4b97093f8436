"""The one mapping from what went wrong to the command's exit code. Engine errors are matched by class
(the most specific first); the table is also the exit code section of `savepoints --help`."""

from __future__ import annotations

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

EXIT_CODES: list[tuple[type[SavepointsError], int, str]] = [
    (InvalidInput, 2, "bad input or usage: malformed URI, invalid name, bad label"),
    (NotFound, 3, "not found: job, snapshot, checkpoint location, bucket"),
    (
        Refused,
        4,
        "refused to avoid losing or overwriting data (a non-empty restore target, a FAILED or IN_PROGRESS snapshot, "
        "a pinned snapshot, a sink that already holds the batches a restore or a fresh start would run, Kafka "
        "offsets whose records are gone, an upgrade blocked by its pre-flight): nothing changed",
    ),
    (CheckpointError, 5, "not a usable checkpoint: no metadata, no committed batch, files vanishing mid-copy"),
    (IntegrityError, 6, "integrity: checksum mismatch, `verify` failed, corrupt or unsafe manifest"),
    (StoreUnavailable, 7, "store unreachable, credentials missing or refused"),
    (BrokerUnavailable, 7, "a Kafka broker whose offsets must be checked is unreachable"),
    (ClusterUnavailable, 7, "YARN's ResourceManager is unreachable or refused a kill"),
    (SparkToolFailed, 8, "a Spark tool failed (deep verify, rescale, a Delta sink's rewind, inspect, diff)"),
    (LaunchFailed, 9, "a job could not be launched, or failed while starting (its Spark error is shown)"),
    (TimedOut, 10, "timed out: a job did not stop in time; the request is withdrawn, the job keeps running"),
    (
        UpgradeFailed,
        11,
        "an upgrade did not go through: aborted before its cutover (the old version runs on) or rolled back "
        "after it (`savepoints upgrade JOB --show`)",
    ),
]


def exit_code(exc: SavepointsError) -> int:
    """The exit code of an engine error: its class's, or the nearest base class's; 1 if none."""
    for cls in type(exc).__mro__:
        for known, code, _ in EXIT_CODES:
            if cls is known:
                return code
    return UNEXPECTED


def describe() -> str:
    """The exit code table for --help."""
    rows = [f"  {OK:>2}  done", f"  {UNEXPECTED:>2}  unexpected error (run with -v for details)"]
    rows += [f"  {code:>2}  {meaning}" for _, code, meaning in sorted(EXIT_CODES, key=lambda row: row[1])]
    return "exit codes:\n" + "\n".join(rows)
