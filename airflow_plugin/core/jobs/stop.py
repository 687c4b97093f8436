"""Stop a running deployment through its control channel, optionally with a savepoint of the quiescent
checkpoint (Flink's stop-with-savepoint); force-kill one that will not stop; report job status."""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from ..errors import Refused, SavepointsError, TimedOut
from ..process import Liveness
from ..records.deployment import ControlRequest, Deployment, State, failed_for_it
from ..records.manifest import Kind, Manifest, Trigger
from ..timestamps import utc_now
from .context import JobContext
from .deploy import live_deployments
from .deployments import describe, new_request_id
from .fence import FENCED, KILLED, leave_out, wait_fenced
from .launcher import Killed, force_kill, process_seen
from .observe import observe_deployment, state_of
from .operation import operation
from .snapshot import snapshot_deployment

log = logging.getLogger(__name__)


@dataclass
class StopResult:
    deployment: Deployment
    state: State
    seconds: float
    snapshot: Manifest | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **describe(self.deployment, None, self.state),
            "seconds": round(self.seconds, 3),
            "snapshot": self.snapshot.summary() if self.snapshot else None,
        }


def running_deployment(ctx: JobContext, consequence: str = "nothing to stop") -> Deployment:
    live = [(d, s) for d, s in live_deployments(ctx) if s.live]
    # the running version, not a pre-started driver waiting next to it (unless that is all there is)
    live = [(d, s) for d, s in live if s is not State.STANDBY] or live
    if not live:
        latest = ctx.deployments.list(ctx.name)[-1:]
        detail = f" (its latest deployment {latest[0].id} is {state_of(ctx, latest[0])})" if latest else ""
        raise Refused(f"job {ctx.name} has no running deployment{detail}: {consequence}")
    return live[-1][0]


def stop(
    ctx: JobContext,
    *,
    savepoint: bool = False,
    drain: bool = False,
    timeout: float | None = None,
    labels: dict[str, str] | None = None,
    pin: bool = False,
    deployment_id: str | None = None,
) -> StopResult:
    """Ask the running deployment (or the given one) to stop at a batch boundary and wait for STOPPED. If it
    does not stop in time the request is withdrawn, the job keeps running, and nothing is deleted."""
    with operation(ctx, "stop"):
        return _stop(ctx, savepoint, drain, timeout, labels, pin, deployment_id)


def _stop(
    ctx: JobContext,
    savepoint: bool,
    drain: bool,
    timeout: float | None,
    labels: dict[str, str] | None,
    pin: bool,
    deployment_id: str | None,
) -> StopResult:
    if savepoint and ctx.spec.delivery == "at-most-once":
        raise Refused(
            f"job {ctx.name} runs at-most-once: its runtime keeps no resumable checkpoint, so there is nothing to "
            "savepoint; stop it without --savepoint"
        )
    request = ControlRequest(id=stop_request_id(ctx), action="stop", drain=drain, requested_by=ctx.requested_by)
    deployment = _earlier_attempt(ctx, request.id, deployment_id)
    if deployment is None:
        deployment = ctx.deployments.get(ctx.name, deployment_id) if deployment_id else running_deployment(ctx)
        ctx.deployments.request(ctx.name, deployment.id, request)
    timeout = timeout if timeout is not None else ctx.spec.trigger_seconds + 60
    started = time.monotonic()
    try:
        state = _wait_stopped(ctx, deployment, timeout)
    except SavepointsError as lost:  # a driver only paused must not stop later, when nobody expects it
        ctx.deployments.withdraw(ctx.name, deployment.id, request)
        status = ctx.deployments.status(ctx.name, deployment.id)
        if status is None or request.id not in status.handled_requests:
            raise
        raise SavepointsError(  # too late to take back: it was stopping when its heartbeat stopped
            f"deployment {deployment.id} of job {ctx.name} was lost while stopping, after it took the stop request "
            f"{request.id}: should its driver wake, it finishes that stop. Its checkpoint is intact: deploy with "
            "--restore latest-state once it has ended"
        ) from lost
    if state is None:
        ctx.deployments.withdraw(ctx.name, deployment.id, request)
        status = ctx.deployments.status(ctx.name, deployment.id)
        raise TimedOut(
            f"deployment {deployment.id} of job {ctx.name} did not stop within {timeout:.0f}s "
            f"(state {status.state if status else 'unknown'}, last batch {status.last_batch_id if status else '-'}); "
            "the stop request was withdrawn, the job keeps running and nothing was deleted. Retry with a longer "
            f"--timeout, or force it with `savepoints kill {ctx.name}`"
        )
    result = StopResult(deployment, state, time.monotonic() - started)
    if state is State.FAILED:
        status = ctx.deployments.status(ctx.name, deployment.id)
        raise SavepointsError(
            f"deployment {deployment.id} of job {ctx.name} FAILED instead of stopping: "
            f"{status.error_class if status else ''} {status.error_message if status else ''}; no savepoint taken"
        )
    if savepoint:
        result.snapshot = snapshot_deployment(
            ctx, deployment, kind=Kind.SAVEPOINT, trigger=Trigger.STOP, labels=labels, pin=pin
        )
    if not deployment.retired_at:
        deployment.retired_at = utc_now()
        ctx.deployments.put(deployment)
    return result


def stop_request_id(ctx: JobContext) -> str:
    """The stop's control request id: derived from the request when it has one (an Airflow task), so that
    a retry of it recognises the deployment its dead try asked to stop; a fresh one otherwise."""
    if not ctx.settings.request_id:
        return new_request_id()
    return "rq-stop-" + hashlib.sha256(ctx.settings.request_id.encode()).hexdigest()[:20]


def _earlier_attempt(ctx: JobContext, control_id: str, deployment_id: str | None) -> Deployment | None:
    """The deployment an earlier attempt of this same request asked to stop (a retried Airflow task whose
    worker died): the retry waits for that stop instead of finding nothing running and failing, and then
    takes the savepoint the dead try may not have finished (snapshot.py adopts a COMPLETED one). So a
    stop-with-savepoint retried at any point ends with the deployment stopped and one COMPLETED snapshot."""
    if not ctx.settings.request_id:
        return None
    for deployment in reversed(ctx.deployments.list(ctx.name)):
        if deployment_id not in (None, deployment.id):
            continue
        status = ctx.deployments.status(ctx.name, deployment.id)
        handled = status is not None and control_id in status.handled_requests
        if handled or any(r.id == control_id for r in ctx.deployments.requests(ctx.name, deployment.id)):
            log.info("request %s: continuing the stop of deployment %s", ctx.settings.request_id, deployment.id)
            return deployment
    return None


def _wait_stopped(ctx: JobContext, deployment: Deployment, timeout: float) -> State | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = state_of(ctx, deployment)
        if state in (State.STOPPED, State.FAILED):
            return state
        if state is State.LOST:
            raise SavepointsError(
                f"deployment {deployment.id} of job {ctx.name} was lost while stopping (no heartbeat, or its "
                "process is gone): the stop request was withdrawn, its checkpoint is intact; should it not come "
                "back, deploy with --restore latest-state"
            )
        time.sleep(0.2)
    return None


@dataclass(frozen=True)
class KillResult:
    deployment: Deployment
    killed: Killed  # KILLED, ENDED (already gone), UNREACHABLE (fenced instead)

    @property
    def said(self) -> str:
        """What was done, for a person."""
        if self.killed is Killed.UNREACHABLE:
            return (
                f"fenced deployment {self.deployment.id} of job {self.deployment.job}: its driver cannot be killed "
                "from here (another machine or container); it is left out of the job's writers and can commit "
                "nothing more. End its process where it runs"
            )
        how = "killed" if self.killed is Killed.KILLED else "marked FAILED (its driver had already ended)"
        return f"{how} deployment {self.deployment.id} of job {self.deployment.job}"


def kill(ctx: JobContext, deployment_id: str | None = None) -> KillResult:
    """End the job's live or LOST deployment by force (SIGKILL of its process group, YARN's kill) and mark it FAILED:
    the given one, else the newest. A driver this process cannot reach is fenced instead (jobs/fence.py): left
    out of the job's writers, and waited for until it can commit no more."""
    with operation(ctx, "kill"):
        return _kill(ctx, deployment_id)


def _kill(ctx: JobContext, deployment_id: str | None) -> KillResult:
    candidates = [(d, s) for d, s in live_deployments(ctx) if deployment_id in (None, d.id)]
    if not candidates:
        which = f"deployment {deployment_id}" if deployment_id else "deployment"
        raise Refused(f"job {ctx.name} has no running or lost {which} to kill")
    deployment, _ = candidates[-1]
    killed = force_kill(deployment.launcher)
    previous = ctx.deployments.status(ctx.name, deployment.id)
    error_class, error_message = KILLED, "force-killed by `savepoints kill`"
    if process_seen(deployment.launcher) is not Liveness.GONE:
        # not seen gone: unreachable from here, or ended by a cluster's manager (YARN's word: a driver cut off from
        # it may run on). Left out of the writers, and waited for until its fence has lapsed
        why = "could not reach its driver" if killed is Killed.UNREACHABLE else "killed it through the cluster"
        change = leave_out(ctx, deployment, f"`savepoints kill` by {ctx.requested_by} {why}")
        wait_fenced(ctx, [deployment.id], change)
        if killed is Killed.UNREACHABLE:
            error_class = FENCED
            error_message = (
                f"fenced by `savepoints kill` (generation {change.record.generation}): its driver could not be "
                "reached from here, and can commit nothing more"
            )
    ctx.deployments.write_status(ctx.name, deployment.id, failed_for_it(previous, error_class, error_message))
    deployment.retired_at = utc_now()
    ctx.deployments.put(deployment)
    return KillResult(deployment, killed)


def job_status(ctx: JobContext, *, retired: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """One row per deployment, oldest first: what `savepoints status` shows. `retired`: of the retired
    deployments, only the newest that many (None: all); every one not retired is shown. Returns the rows
    and how many retired ones were left out. One read of the job's index and the heartbeats of the
    deployments not retired: a retired one's final heartbeat is in the index."""
    deployments = ctx.deployments.list(ctx.name)
    old = [d.id for d in deployments if d.retired_at]
    hidden = set(old[: max(0, len(old) - retired)] if retired is not None else ())
    rows = [describe(d, *observe_deployment(ctx, d)) for d in deployments if d.id not in hidden]
    return rows, len(hidden)
