"""A savepoint of a job by name: of its running deployment's live checkpoint, or stop-with-savepoint.
What the savepoint operator, the savepoint DAG and the UI button call."""

from __future__ import annotations

from ..errors import Refused
from ..records.deployment import Deployment
from ..records.manifest import Kind, Manifest, Trigger
from .context import JobContext
from .snapshot import snapshot_deployment
from .stop import running_deployment, stop


def take_savepoint(
    ctx: JobContext,
    *,
    kind: Kind = Kind.SAVEPOINT,
    stop_after: bool = False,
    drain: bool = False,
    pin: bool = False,
    labels: dict[str, str] | None = None,
    trigger: Trigger = Trigger.MANUAL,
    timeout: float | None = None,
) -> Manifest:
    """Snapshot the running deployment's checkpoint while it keeps running, or (stop_after) stop it at a
    batch boundary first and snapshot the quiescent checkpoint (Flink's stop-with-savepoint)."""
    if stop_after:
        if kind is not Kind.SAVEPOINT:
            raise Refused(f"stop-with-savepoint of job {ctx.name} takes a savepoint, not a {kind}")
        result = stop(ctx, savepoint=True, drain=drain, timeout=timeout, labels=labels, pin=pin)
        assert result.snapshot is not None  # savepoint=True always takes one or raises
        return result.snapshot
    deployment = savepoint_target(ctx)
    return snapshot_deployment(ctx, deployment, kind=kind, trigger=trigger, labels=labels, pin=pin)


def savepoint_target(ctx: JobContext) -> Deployment:
    """The deployment a savepoint of the job is taken of; refused, saying what to do, when none runs."""
    return running_deployment(
        ctx,
        f"nothing to savepoint; deploy it first (`savepoints deploy {ctx.name}`), or snapshot a stopped "
        "checkpoint with `savepoints create`",
    )
