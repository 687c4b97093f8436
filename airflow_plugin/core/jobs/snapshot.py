"""A snapshot of one deployment of a managed job: the one place the engine snapshots a deployment's
checkpoint (a live savepoint, stop-with-savepoint, a retained checkpoint, `--restore latest-state`), so
that every such snapshot records the same facts: the deployment, its version, who asked, and its sink
as the job's runtime reported it from Spark (so that every restore can check the sink: sinks/)."""

from __future__ import annotations

from ..context import JobContext
from ..sinks import from_description
from ..snapshots.create import SnapshotRequest, create_snapshot
from ..snapshots.manifest import Kind, Manifest, Trigger
from .deployments import Deployment


def snapshot_deployment(
    ctx: JobContext,
    deployment: Deployment,
    *,
    kind: Kind,
    trigger: Trigger,
    labels: dict[str, str] | None = None,
    pin: bool = False,
    requested_by: str | None = None,
) -> Manifest:
    status = ctx.deployments.status(ctx.name, deployment.id)
    sink = from_description(status.sink if status else None)
    request = SnapshotRequest(
        job=ctx.name,
        kind=kind,
        trigger=trigger,
        requested_by=ctx.requested_by if requested_by is None else requested_by,
        labels=dict(labels or {}),
        pinned=pin,
        deployment=deployment.id,
        job_version=deployment.version,
        sinks=(sink,) if sink else (),
    )
    return create_snapshot(
        ctx.store,
        ctx.open(deployment.checkpoint),
        request,
        progress=ctx.progress,
        concurrency=ctx.settings.concurrency,
        open_location=ctx.open,
    )
