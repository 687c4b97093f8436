"""Stop a running deployment through its control channel, optionally with a savepoint of the quiescent
checkpoint (Flink's stop-with-savepoint); force-kill one that will not stop; report job status."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..errors import Refused, SavepointsError, TimedOut
from ..progress import Progress
from ..snapshots.create import SnapshotRequest, create_snapshot
from ..snapshots.manifest import Kind, Manifest, Trigger, utc_now
from ..snapshots.store import SnapshotStore
from ..storage import open_storage
from .deploy import live_deployments
from .deployments import ControlRequest, Deployment, Deployments, State, Status, new_request_id, observed_state
from .launcher import force_kill
from .spec import JobSpec


@dataclass
class StopResult:
    deployment: Deployment
    state: State
    seconds: float
    snapshot: Manifest | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.deployment.job,
            "deployment": self.deployment.id,
            "version": self.deployment.version,
            "state": str(self.state),
            "seconds": round(self.seconds, 3),
            "snapshot": self.snapshot.summary() if self.snapshot else None,
        }


def running_deployment(deployments: Deployments, job: JobSpec, consequence: str = "nothing to stop") -> Deployment:
    live = [(d, s) for d, s in live_deployments(deployments, job) if s.live]
    # the running version, not a pre-started driver waiting next to it (unless that is all there is)
    live = [(d, s) for d, s in live if s is not State.STANDBY] or live
    if not live:
        latest = deployments.list(job.name)[-1:] or [None]
        detail = ""
        if latest[0] is not None:
            state = observed_state(latest[0], deployments.status(job.name, latest[0].id), job.heartbeat_timeout)
            detail = f" (its latest deployment {latest[0].id} is {state})"
        raise Refused(f"job {job.name} has no running deployment{detail}: {consequence}")
    return live[-1][0]


def stop(
    job: JobSpec,
    store: SnapshotStore,
    *,
    savepoint: bool = False,
    drain: bool = False,
    timeout: float | None = None,
    requested_by: str = "",
    labels: dict[str, str] | None = None,
    pin: bool = False,
    deployment_id: str | None = None,
    progress: Progress | None = None,
) -> StopResult:
    """Ask the running deployment (or the given one) to stop at a batch boundary and wait for STOPPED. If it
    does not stop in time the request is withdrawn, the job keeps running, and nothing is deleted."""
    if savepoint and job.delivery == "at-most-once":
        raise Refused(
            f"job {job.name} runs at-most-once: its runtime keeps no resumable checkpoint, so there is nothing to "
            "savepoint; stop it without --savepoint"
        )
    deployments = Deployments(store.storage)
    deployment = deployments.get(job.name, deployment_id) if deployment_id else running_deployment(deployments, job)
    timeout = timeout if timeout is not None else job.trigger_seconds + 60
    started = time.monotonic()
    request = ControlRequest(id=new_request_id(), action="stop", drain=drain, requested_by=requested_by)
    deployments.request(job.name, deployment.id, request)
    state = _wait_stopped(deployments, job, deployment, request, timeout)
    if state is None:
        store.storage.delete([f"jobs/{job.name}/deployments/{deployment.id}/control/{request.id}.json"])
        status = deployments.status(job.name, deployment.id)
        raise TimedOut(
            f"deployment {deployment.id} of job {job.name} did not stop within {timeout:.0f}s "
            f"(state {status.state if status else 'unknown'}, last batch {status.last_batch_id if status else '-'}); "
            "the stop request was withdrawn, the job keeps running and nothing was deleted. Retry with a longer "
            f"--timeout, or force it with `savepoints kill {job.name}`"
        )
    result = StopResult(deployment, state, time.monotonic() - started)
    if state is State.FAILED:
        status = deployments.status(job.name, deployment.id)
        raise SavepointsError(
            f"deployment {deployment.id} of job {job.name} FAILED instead of stopping: "
            f"{status.error_class if status else ''} {status.error_message if status else ''}; no savepoint taken"
        )
    if savepoint:
        result.snapshot = create_snapshot(
            store,
            open_storage(deployment.checkpoint),
            SnapshotRequest(
                job=job.name,
                kind=Kind.SAVEPOINT,
                trigger=Trigger.STOP,
                requested_by=requested_by,
                deployment=deployment.id,
                job_version=deployment.version,
                labels=dict(labels or {}),
                pinned=pin,
            ),
            progress=progress,
        )
    deployment.retired_at = utc_now()
    deployments.put(deployment)
    return result


def _wait_stopped(
    deployments: Deployments, job: JobSpec, deployment: Deployment, request: ControlRequest, timeout: float
) -> State | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = deployments.status(job.name, deployment.id)
        state = observed_state(deployment, status, job.heartbeat_timeout)
        if state in (State.STOPPED, State.FAILED):
            return state
        if state is State.LOST:
            raise SavepointsError(
                f"deployment {deployment.id} of job {job.name} was lost while stopping (no heartbeat, or its "
                "process is gone): its checkpoint is intact; deploy with --restore latest-state"
            )
        time.sleep(0.2)
    return None


def kill(job: JobSpec, store: SnapshotStore, deployment_id: str | None = None) -> Deployment:
    """Force-kill the job's live or LOST deployment (SIGKILL of its process group) and mark it FAILED:
    the given one, else the newest."""
    deployments = Deployments(store.storage)
    candidates = [(d, s) for d, s in live_deployments(deployments, job) if deployment_id in (None, d.id)]
    if not candidates:
        which = f"deployment {deployment_id}" if deployment_id else "deployment"
        raise Refused(f"job {job.name} has no running or lost {which} to kill")
    deployment, _ = candidates[-1]
    force_kill(deployment.launcher)
    previous = deployments.status(job.name, deployment.id)
    deployments.write_status(
        job.name,
        deployment.id,
        Status(
            state=State.FAILED,
            updated_at=time.time(),
            query_id=previous.query_id if previous else None,
            last_batch_id=previous.last_batch_id if previous else None,
            error_class="KILLED",
            error_message="force-killed by `savepoints kill`",
        ),
    )
    deployment.retired_at = utc_now()
    deployments.put(deployment)
    return deployment


def job_status(job: JobSpec, store: SnapshotStore) -> list[dict[str, Any]]:
    """One row per deployment, oldest first: what `savepoints status` shows."""
    deployments = Deployments(store.storage)
    rows = []
    for deployment in deployments.list(job.name):
        status = deployments.status(job.name, deployment.id)
        rows.append(
            {
                "job": job.name,
                "deployment": deployment.id,
                "version": deployment.version,
                "state": str(observed_state(deployment, status, job.heartbeat_timeout)),
                "heartbeat_age_s": round(status.age(), 1) if status else None,
                "last_batch_id": status.last_batch_id if status else None,
                "rows_per_second": status.processed_rows_per_second if status else None,
                "restored_from": deployment.restored_from,
                "checkpoint": deployment.checkpoint,
                "error": f"{status.error_class}: {status.error_message}" if status and status.error_class else None,
            }
        )
    return rows
