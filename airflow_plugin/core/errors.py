"""The engine's errors. Each names the thing that is wrong and the fix, and maps to a CLI exit code."""

from __future__ import annotations


class SavepointsError(Exception):
    """Base of every error the engine raises on purpose. `exit_code` is what the CLI exits with."""

    exit_code = 1


class InvalidInput(SavepointsError):
    """The caller passed something malformed: a bad URI, a bad option value, a bad label."""

    exit_code = 2


class NotFound(SavepointsError):
    """A job, snapshot, checkpoint location or bucket that does not exist."""

    exit_code = 3


class Refused(SavepointsError):
    """The request is well-formed but would lose or overwrite data (non-empty restore target, a FAILED
    snapshot, a sink that is ahead of the snapshot): nothing was changed."""

    exit_code = 4


class Conflict(Refused):
    """A conditional write lost a race: the object was created, changed or deleted by someone else since it
    was read. Nothing was written."""


class CheckpointError(SavepointsError):
    """The checkpoint location is not a usable Spark checkpoint (empty, no committed batch, files missing)."""

    exit_code = 5


class CheckpointChanged(CheckpointError):
    """A file needed for batch N vanished or changed while it was copied (Spark's cleanup ran):
    the snapshot is retried at a newer batch."""


class IntegrityError(SavepointsError):
    """Stored data does not match its manifest: a checksum, a size or a missing blob."""

    exit_code = 6


class StoreUnavailable(SavepointsError):
    """The store cannot be reached or refuses us: endpoint down, missing bucket access, no credentials."""

    exit_code = 7


class TimedOut(SavepointsError):
    """Something did not happen in time (a job that does not stop); nothing was changed because of it."""

    exit_code = 10
