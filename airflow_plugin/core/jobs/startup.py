"""Launching a deployment's driver and waiting for it to start: nothing blocks on spark-submit, so the
engine watches the driver's heartbeat in the store and reports each stage of the start-up (launched,
creating the Spark session, waiting for the first batch) through the context's progress, until the driver
reports the state it waits for or fails with its own error (or spark-submit exits first: its log tail). A
driver whose sink guard refused to start the query (the sink already holds its batches) is a refusal (exit 4),
not a failed launch."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ..errors import LaunchFailed, Refused
from ..guards.sink import SINK_AHEAD
from ..records.deployment import Deployment, DeploymentStatus, State
from .context import JobContext
from .launcher import SubmitSpec, exit_code, launch, log_tail, submitted
from .observe import observe_deployment

log = logging.getLogger(__name__)


def launch_deployment(ctx: JobContext, deployment: Deployment, spec: SubmitSpec) -> None:
    """spark-submit, detached; the handle goes into the deployment record. In cluster mode spark-submit returns
    once the cluster accepted the application: the id the cluster gave it (YARN's application id) is recorded
    too, so that status, kill and a driver the cluster ends are asked of the cluster."""
    log_path = Path(ctx.spec.log_dir) / ctx.name / f"{deployment.id}.log"
    ctx.progress.stage(f"launching deployment {deployment.id} of {ctx.name} with spark-submit (log {log_path})")
    deployment.launcher = launch(spec, log_path, ctx.command_builder)
    ctx.deployments.put(deployment)
    if deployment.launcher.get("mode") == "cluster":
        ctx.progress.stage(f"deployment {deployment.id}: spark-submit hands the application to {spec.master}")
        try:
            ids = submitted(deployment.launcher)
        except LaunchFailed as exc:
            failed = DeploymentStatus(State.FAILED, time.time(), error_class="LAUNCH_FAILED", error_message=str(exc))
            ctx.deployments.write_status(deployment.job, deployment.id, failed)
            raise
        deployment.launcher.update(ids)
        ctx.deployments.put(deployment)


def stage_of(status: DeploymentStatus | None, deployment: Deployment, what: str) -> str:
    """What a starting driver is doing, from its heartbeat."""
    if status is None:
        return f"deployment {deployment.id}: spark-submit started, waiting for the driver to report"
    if status.app_id is None:
        return f"deployment {deployment.id}: the driver runs, creating its Spark session"
    ui = f", Spark UI {status.ui_url}" if status.ui_url else ""
    waiting = "the first batch" if what == "RUNNING" else f"{what} (warming up)"
    return f"deployment {deployment.id}: Spark session {status.app_id} up{ui}; waiting for {waiting}"


def wait_until_started(ctx: JobContext, deployment: Deployment, wait_seconds: float) -> None:
    """Return once the job reports RUNNING (its first trigger is done); fail with its own error if it fails
    or exits first. `wait_seconds` 0: do not wait (an upgrade's health gate watches instead)."""
    if wait_seconds <= 0:
        return
    wait_for_state(ctx, deployment, (State.RUNNING, State.STOPPING, State.STOPPED), wait_seconds, "RUNNING")


def wait_for_state(
    ctx: JobContext, deployment: Deployment, states: tuple[State, ...], wait_seconds: float, what: str
) -> bool:
    """Wait until the job reports one of `states` (True), or `wait_seconds` passed (False: it may still be
    starting); fail with its own error if it fails or exits first."""
    deployments = ctx.deployments
    deadline = time.monotonic() + wait_seconds
    in_cluster = deployment.launcher.get("mode") == "cluster"  # spark-submit has returned: the cluster runs it
    try:
        while time.monotonic() < deadline:
            # the store, and in cluster mode what the cluster says of a driver it ended (asked every few seconds)
            status = (
                observe_deployment(ctx, deployment)[0]
                if in_cluster
                else deployments.status(deployment.job, deployment.id)
            )
            if status is not None and status.state in states:
                return True
            if status is not None and status.state is State.FAILED:
                failed = f"deployment {deployment.id} of job {deployment.job} FAILED"
                if status.error_class == SINK_AHEAD:  # the runtime refused to start the query: nothing ran
                    raise Refused(f"{failed}, refused by its sink guard: {status.error_message}")
                raise LaunchFailed(f"{failed}: {status.error_class or ''} {status.error_message or ''}".strip())
            code = None if in_cluster else exit_code(deployment.launcher)
            if code is not None:
                status = deployments.status(deployment.job, deployment.id)
                if status is not None and status.state is State.FAILED:
                    continue  # report the job's own error on the next round
                tail = log_tail(deployment.launcher)
                failed = DeploymentStatus(State.FAILED, time.time(), error_class="LAUNCH_FAILED", error_message=tail)
                deployments.write_status(deployment.job, deployment.id, failed)
                raise LaunchFailed(
                    f"deployment {deployment.id} of job {deployment.job}: spark-submit exited with code {code} "
                    f"before the job started; log {deployment.launcher.get('log')}:\n{tail}"
                )
            ctx.progress.stage(stage_of(status, deployment, what))
            time.sleep(0.1)
        log.warning(
            "deployment %s has not reported %s after %.0fs; it may still be starting", deployment.id, what, wait_seconds
        )
        return False
    finally:
        ctx.progress.finish()
