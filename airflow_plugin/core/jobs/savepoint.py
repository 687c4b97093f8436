"""A savepoint of a job by name: of its running deployment's live checkpoint, or stop-with-savepoint.
What the savepoint operator, the savepoint DAG and the UI button call."""

from __future__ import annotations

from ..errors import Refused
from ..progress import Progress
from ..snapshots.create import SnapshotRequest, create_snapshot
from ..snapshots.manifest import Kind, Manifest, Trigger
from ..snapshots.store import SnapshotStore
from ..storage import open_storage
from .deployments import Deployments
from .spec import JobSpec
from .stop import running_deployment, stop


def take_savepoint(
    job: JobSpec,
    store: SnapshotStore,
    *,
    kind: Kind = Kind.SAVEPOINT,
    stop_after: bool = False,
    drain: bool = False,
    pin: bool = False,
    labels: dict[str, str] | None = None,
    trigger: Trigger = Trigger.MANUAL,
    requested_by: str = "",
    timeout: float | None = None,
    progress: Progress | None = None,
) -> Manifest:
    """Snapshot the running deployment's checkpoint while it keeps running, or (stop_after) stop it at a
    batch boundary first and snapshot the quiescent checkpoint (Flink's stop-with-savepoint)."""
    if stop_after:
        if kind is not Kind.SAVEPOINT:
            raise Refused(f"stop-with-savepoint of job {job.name} takes a savepoint, not a {kind}")
        result = stop(
            job,
            store,
            savepoint=True,
            drain=drain,
            timeout=timeout,
            requested_by=requested_by,
            labels=labels,
            pin=pin,
            progress=progress,
        )
        assert result.snapshot is not None  # savepoint=True always takes one or raises
        return result.snapshot
    deployment = running_deployment(
        Deployments(store.storage),
        job,
        f"nothing to savepoint; deploy it first (`savepoints deploy {job.name}`), or snapshot a stopped "
        "checkpoint with `savepoints create`",
    )
    request = SnapshotRequest(
        job=job.name,
        kind=kind,
        trigger=trigger,
        requested_by=requested_by,
        labels=dict(labels or {}),
        pinned=pin,
        deployment=deployment.id,
        job_version=deployment.version,
    )
    return create_snapshot(store, open_storage(deployment.checkpoint), request, progress=progress)
