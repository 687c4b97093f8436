"""A job at a glance, for a fleet overview (the savepoints page): the state of its running deployment (else
of its newest), last batch, heartbeat age and Kafka lag, the age of its last COMPLETED savepoint, how many
of its snapshots FAILED, and whether it is unhealthy, with why. Read from the job's deployment index, the
heartbeats of its deployments not retired and its snapshot catalog: no manifest, no retired deployment's
record or heartbeat."""

from __future__ import annotations

import time
from typing import Any

from ..records.deployment import Deployment, DeploymentStatus, State
from ..records.manifest import Kind, SnapshotStatus
from ..timestamps import epoch_of
from .context import JobContext
from .observe import observe_deployment


def overview(ctx: JobContext, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    deployment, status, state = _shown(ctx)
    snapshots = ctx.store.list(ctx.name)
    savepoints = [s for s in snapshots if s.kind is Kind.SAVEPOINT and s.status is SnapshotStatus.COMPLETED]
    last = savepoints[-1] if savepoints else None
    reasons = _unhealthy(deployment, status, state, now)
    return {
        "job": ctx.name,
        "description": ctx.spec.description,
        "deployment": deployment.id if deployment else None,
        "version": deployment.version if deployment else None,
        "state": str(state) if state else "NONE",
        "last_batch_id": status.last_batch_id if status else None,
        "heartbeat_age_s": round(status.age(now), 1) if status else None,
        "kafka_lag": status.kafka_lag if status else None,
        "last_savepoint": last.id if last else None,
        "last_savepoint_age_s": round(now - epoch_of(last.completed_at or last.created_at), 1) if last else None,
        "failed_snapshots": sum(s.status is SnapshotStatus.FAILED for s in snapshots),
        "snapshots": len(snapshots),
        "unhealthy": "; ".join(reasons) or None,
    }


def _shown(ctx: JobContext) -> tuple[Deployment | None, DeploymentStatus | None, State | None]:
    """The deployment a glance is about: the running one (not a pre-started driver beside it), else one that
    may still run (LOST), else the newest."""
    deployments = ctx.deployments.list(ctx.name)
    current = [(d, *observe_deployment(ctx, d)) for d in deployments if not d.retired_at]
    maybe_running = [c for c in current if c[2].live or c[2] is State.LOST]
    chosen = [c for c in maybe_running if c[2] is not State.STANDBY] or maybe_running
    if chosen:
        return chosen[-1]
    if not deployments:
        return None, None, None
    return (deployments[-1], *observe_deployment(ctx, deployments[-1]))


def _unhealthy(
    deployment: Deployment | None, status: DeploymentStatus | None, state: State | None, now: float
) -> list[str]:
    if deployment is None or state is None:
        return []
    reasons = []
    if state is State.LOST:
        age = f"no heartbeat for {status.age(now):.0f} s" if status else "no heartbeat"
        reasons.append(f"deployment {deployment.id} is LOST ({age}, or its driver process is gone)")
    if state is State.FAILED:
        error = f": {status.error_class}: {status.error_message}" if status and status.error_class else ""
        reasons.append(f"deployment {deployment.id} FAILED{error}")
    skipping = status.skipping() if status else None
    if skipping:
        reasons.append(skipping)
    return reasons
