"""The engine's errors. Each names the thing that is wrong and the fix."""

from __future__ import annotations


class SavepointsError(Exception):
    """Base of every error the engine raises on purpose. The CLI maps each class to an exit code
    (cli/exit_codes.py), the savepoints page to an HTTP status (ui/errors.py)."""


class InvalidInput(SavepointsError):
    """The caller passed something malformed: a bad URI, a bad option value, a bad label."""


class NotFound(SavepointsError):
    """A job, snapshot, checkpoint location or bucket that does not exist."""


class NoState(NotFound):
    """A deploy from the latest state found none usable for a job that has run before (a job with no history
    starts fresh instead). The message ends with the fix as the command line spells it; `with_fix` words it
    for another caller (a DAG's form field, an operator's argument)."""

    CLI_FIX = "deploy with --restore none for a fresh start (the earlier state is then not used)"

    def __init__(self, problem: str, fix: str = CLI_FIX) -> None:
        super().__init__(f"{problem}: {fix}")
        self.problem = problem

    def with_fix(self, fix: str) -> NoState:
        return NoState(self.problem, fix)


class Refused(SavepointsError):
    """The request is well-formed but would lose or overwrite data (non-empty restore target, a FAILED
    snapshot, a sink that is ahead of the snapshot): nothing was changed."""


class Conflict(Refused):
    """A conditional write lost a race: the object was created, changed or deleted by someone else since it
    was read. Nothing was written."""


class SourceGap(Refused):
    """A restore would resume a source at positions whose records are gone (Kafka retention deleted them, the
    topic or partition is gone): refused unless the gap is accepted explicitly."""


class CheckpointError(SavepointsError):
    """The checkpoint location is not a usable Spark checkpoint (empty, no committed batch, files missing)."""


class CheckpointChanged(CheckpointError):
    """A file needed for batch N vanished or changed while it was copied (Spark's cleanup ran):
    the snapshot is retried at a newer batch."""


class IntegrityError(SavepointsError):
    """Stored data does not match its manifest: a checksum, a size or a missing blob."""


class StoreUnavailable(SavepointsError):
    """The store cannot be reached or refuses us: endpoint down, missing bucket access, no credentials."""


class ClusterUnavailable(SavepointsError):
    """A cluster manager whose word is needed cannot be reached or refuses the request (YARN's ResourceManager
    for a kill)."""


class BrokerUnavailable(SavepointsError):
    """A Kafka broker whose offsets must be checked cannot be reached (or its client library is missing)."""


class SparkToolFailed(SavepointsError):
    """A Spark application the engine ran for itself (deep verify, rescale, a Delta RESTORE) failed: its stderr
    tail is shown."""


class LaunchFailed(SavepointsError):
    """A Spark application could not be launched (no spark-submit, no Java), or a job failed while starting:
    its Spark error or log tail is shown and kept in its status."""


class TimedOut(SavepointsError):
    """Something did not happen in time (a job that does not stop); nothing was changed because of it."""


class NotReady(TimedOut):
    """A driver launched to wait in STANDBY did not get there in time (its session or its warm-up still running):
    nothing may count on it yet. It runs on: `deployment_id` names it, for whoever stops it or waits longer."""

    def __init__(self, message: str, deployment_id: str = "") -> None:
        super().__init__(message)
        self.deployment_id = deployment_id


class UpgradeFailed(SavepointsError):
    """An upgrade did not go through: aborted before its cutover (the old version runs on) or rolled back after
    it (the old version back from a savepoint); its record says why (`savepoints upgrade JOB --show`)."""
