"""A snapshot of one deployment of a managed job: the one place the engine snapshots a deployment's
checkpoint (a live savepoint, stop-with-savepoint, a retained checkpoint, `--restore latest-state`), so
that every such snapshot records the same facts: the deployment, its version, who asked, and its sink
as the job's runtime reported it from Spark (so that every restore can check the sink: sinks/)."""

from __future__ import annotations

from ..records.deployment import Deployment
from ..records.manifest import Kind, Manifest, SnapshotStatus, Trigger
from ..sinks import from_description
from ..snapshots.create import SnapshotRequest, create_snapshot
from ..timestamps import utc_now
from .context import JobContext


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
    earlier = _earlier_attempt(ctx, deployment)
    if earlier is not None:
        return earlier
    status = ctx.deployments.status(ctx.name, deployment.id)
    sink = from_description(status.sink if status else None)
    gate = status.gate if status else None
    interval = {k: gate.get(k) for k in ("column", "after", "until")} if gate and gate.get("column") else None
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
        request_id=ctx.settings.request_id,
        gate=interval if interval and (interval["after"] is not None or interval["until"] is not None) else None,
        reuse_from=tuple(s for s in (deployment.restored_from, deployment.prerestored_from) if s),
        state_progress=tuple(status.state_operators or []) if status else (),
    )
    return create_snapshot(
        ctx.store,
        ctx.open(deployment.checkpoint),
        request,
        progress=ctx.progress,
        concurrency=ctx.settings.concurrency,
        open_location=ctx.open,
    )


def _earlier_attempt(ctx: JobContext, deployment: Deployment) -> Manifest | None:
    """The snapshot an earlier attempt of this same request took of this deployment (a retried Airflow task
    whose worker died): a COMPLETED one is the answer; one left IN_PROGRESS is marked FAILED (abandoned)
    and a new one is taken. So a retried request leaves one COMPLETED snapshot, never two."""
    request_id = ctx.settings.request_id
    if not request_id:
        return None
    for entry in ctx.store.list(ctx.name):
        if entry.request_id != request_id or entry.deployment != deployment.id:
            continue
        if entry.status is SnapshotStatus.COMPLETED:
            return ctx.store.get(ctx.name, entry.id)
        if entry.status is SnapshotStatus.IN_PROGRESS:
            ctx.store.update(ctx.name, entry.id, lambda manifest: _abandon(manifest, request_id))
    return None


def _abandon(manifest: Manifest, request_id: str) -> None:
    if manifest.status is SnapshotStatus.IN_PROGRESS:  # not finished meanwhile after all
        manifest.status = SnapshotStatus.FAILED
        manifest.error = f"abandoned: the attempt that took it died; request {request_id} was retried"
        manifest.completed_at = utc_now()
