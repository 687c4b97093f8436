"""Deploy a job version as a new deployment with its own checkpoint location, optionally from state:

    none              a fresh start
    latest-savepoint  the newest COMPLETED savepoint of the job
    latest-state      the newest of: the previous deployment's live checkpoint and the job's snapshots
                      (the live checkpoint is snapshotted first, so it is never claimed by the new one)
    <snapshot id>     that snapshot

Observe (deployments, heartbeats, snapshots) -> decide (refusals, restore source) -> act (restore,
launch, wait until the job runs or fails).

A cutover can also pre-start the new driver (`prestart`): it is launched while the old version still
runs, creates its Spark session (the slow part of a start) and waits in STANDBY; once the old version
stopped, `activate` restores the state into its location and tells it to start: the downtime no longer
includes the JVM and session start-up."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError, NotFound, Refused
from ..progress import Progress
from ..snapshots.checkpoint import read_restart_point
from ..snapshots.create import SnapshotRequest, create_snapshot
from ..snapshots.manifest import Kind, Manifest, Trigger
from ..snapshots.restore import execute_restore, plan_restore
from ..snapshots.store import SnapshotStore
from ..storage import open_storage
from .deployments import (
    ControlRequest,
    Deployment,
    Deployments,
    State,
    Status,
    new_deployment_id,
    new_request_id,
    observed_state,
)
from .launcher import (
    CommandBuilder,
    LaunchFailed,
    SubmitSpec,
    alive,
    default_command,
    exit_code,
    launch,
    log_tail,
    on_this_host,
)
from .rescale import PARTITIONS_CONF, check_rescalable, current_partitions, repartition
from .spec import JobSpec, VersionSpec

log = logging.getLogger(__name__)

RESTORE_MODES = ("none", "latest-state", "latest-savepoint")


@dataclass(frozen=True)
class DeployRequest:
    job: JobSpec
    version: str | None = None
    restore: str = "none"
    partitions: int | None = None  # state partitions; differs from the snapshot's: rescale (repartition)
    wait_seconds: float = 180.0  # until the job reports RUNNING (Spark start-up on a busy machine); 0: do not wait
    requested_by: str = ""


def live_deployments(deployments: Deployments, job: JobSpec) -> list[tuple[Deployment, State]]:
    found = []
    for deployment in deployments.list(job.name):
        state = observed_state(deployment, deployments.status(job.name, deployment.id), job.heartbeat_timeout)
        if state.live or state is State.LOST:
            found.append((deployment, state))
    return found


def _restore_source(
    store: SnapshotStore,
    deployments: Deployments,
    job: JobSpec,
    mode: str,
    progress: Progress | None,
    exclude: str | None = None,  # the deployment being activated: its empty location is no source
) -> Manifest | None:
    if mode == "none":
        return None
    if mode == "latest-savepoint":
        return store.latest(job.name, kind=Kind.SAVEPOINT)
    if mode != "latest-state":
        return store.get(job.name, mode)
    try:
        newest = store.latest(job.name)
    except NotFound:
        newest = None
    previous = [d for d in deployments.list(job.name) if d.id != exclude]
    if previous:
        last = previous[-1]
        location = open_storage(last.checkpoint)
        try:
            live_batch = read_restart_point(location).batch_id
        except (NotFound, CheckpointError):
            live_batch = None
        if live_batch is not None and (newest is None or (newest.batch_id or -1) < live_batch):
            log.info("latest state is the live checkpoint of %s at batch %d: snapshotting it", last.id, live_batch)
            request = SnapshotRequest(
                job=job.name,
                kind=Kind.CHECKPOINT,
                trigger=Trigger.UPGRADE,
                requested_by="deploy --restore latest-state",
                deployment=last.id,
                job_version=last.version,
                labels={"reason": "latest-state"},
            )
            return create_snapshot(store, location, request, progress=progress)
    if newest is None:
        raise NotFound(
            f"job {job.name} has no earlier deployment or snapshot to take its state from: "
            "deploy with --restore none for a fresh start"
        )
    return newest


def deploy(
    request: DeployRequest,
    store: SnapshotStore,
    *,
    command_builder: CommandBuilder = default_command,
    progress: Progress | None = None,
) -> Deployment:
    job = request.job
    version = job.version(request.version)
    deployments = Deployments(store.storage)
    _refuse_while_live(deployments, job)
    source = _restore_source(store, deployments, job, request.restore, progress)

    deployment_id = new_deployment_id()
    checkpoint = _claimable_location(deployments, job, deployment_id)
    target = open_storage(checkpoint)
    plan = plan_restore(store, job.name, source.id, target) if source else None
    rescale_to = None
    if source and request.partitions and request.partitions != current_partitions(source):
        check_rescalable(source, request.partitions)  # before anything is written
        rescale_to = request.partitions

    deployment = Deployment(
        id=deployment_id,
        job=job.name,
        version=version.name,
        checkpoint=checkpoint,
        restored_from=source.id if source else None,
        restored_batch_id=source.batch_id if source else None,
        spark_conf={**job.conf, **version.conf, **(plan.spark_conf if plan else {})},
    )
    if request.partitions:
        deployment.spark_conf[PARTITIONS_CONF] = str(request.partitions)
    deployments.put(deployment)  # claims the location before anything is written there
    if plan is not None:
        execute_restore(store, plan, progress=progress)
    if plan is not None and rescale_to is not None:
        batch = repartition(target, plan.spark_conf, rescale_to)
        log.info("rescaled the state of %s to %d partitions (batch %d)", deployment.id, rescale_to, batch)

    spec = submit_spec(job, version, deployment_id, checkpoint, deployment.spark_conf)
    log_path = Path(job.log_dir) / job.name / f"{deployment_id}.log"
    deployment.launcher = launch(spec, log_path, command_builder)
    deployments.put(deployment)
    _wait_until_started(deployments, deployment, request.wait_seconds)
    return deployment


def _refuse_while_live(deployments: Deployments, job: JobSpec, besides: str | None = None) -> None:
    for deployment, state in live_deployments(deployments, job):
        if deployment.id == besides:
            continue
        gone = on_this_host(deployment.launcher) and not alive(deployment.launcher)
        if state.live or not gone:  # a LOST one elsewhere might still write the sink
            raise Refused(
                f"job {job.name} already has deployment {deployment.id} in state {state}: stop it first "
                f"(`savepoints stop {job.name}`) or, if it is LOST and surely not running, `savepoints kill {job.name}`"
            )


def _claimable_location(deployments: Deployments, job: JobSpec, deployment_id: str) -> str:
    checkpoint = f"{job.checkpoint_root.rstrip('/')}/{job.name}/{deployment_id}"
    owners = [d.id for d in deployments.list(job.name) if d.checkpoint.rstrip("/") == checkpoint]
    if owners or open_storage(checkpoint).exists():
        owner = f"owned by deployment {', '.join(owners)}" if owners else "not empty"
        raise Refused(f"checkpoint location {checkpoint} is {owner}: every deployment needs its own; nothing done")
    return checkpoint


def prestart(
    job: JobSpec,
    store: SnapshotStore,
    version_name: str | None,
    *,
    wait_seconds: float = 180.0,
    command_builder: CommandBuilder = default_command,
) -> Deployment:
    """Launch a version's driver in STANDBY next to the running deployment; returns once it is ready."""
    version = job.version(version_name)
    deployments = Deployments(store.storage)
    for other, state in live_deployments(deployments, job):
        if state is State.STANDBY:
            raise Refused(f"job {job.name} already has a pre-started deployment {other.id}: activate or stop it first")
    deployment_id = new_deployment_id()
    checkpoint = _claimable_location(deployments, job, deployment_id)
    deployment = Deployment(
        id=deployment_id,
        job=job.name,
        version=version.name,
        checkpoint=checkpoint,
        spark_conf={**job.conf, **version.conf},
    )
    deployments.put(deployment)
    spec = submit_spec(job, version, deployment_id, checkpoint, deployment.spark_conf, ("--standby",))
    deployment.launcher = launch(spec, Path(job.log_dir) / job.name / f"{deployment_id}.log", command_builder)
    deployments.put(deployment)
    _wait_for(deployments, deployment, (State.STANDBY,), wait_seconds, "STANDBY")
    return deployment


def activate(
    job: JobSpec,
    store: SnapshotStore,
    deployment_id: str,
    restore: str,
    *,
    wait_seconds: float = 180.0,
    progress: Progress | None = None,
) -> Deployment:
    """Restore state into a pre-started deployment's location and start its query. Refused while any
    other deployment of the job is live (stop the old version first) or if it is not in STANDBY."""
    deployments = Deployments(store.storage)
    deployment = deployments.get(job.name, deployment_id)
    state = observed_state(deployment, deployments.status(job.name, deployment_id), job.heartbeat_timeout)
    if state is not State.STANDBY:
        raise Refused(
            f"deployment {deployment_id} of job {job.name} is {state}, not a pre-started driver in STANDBY; "
            f"deploy normally (`savepoints deploy {job.name} --restore {restore}`)"
        )
    _refuse_while_live(deployments, job, besides=deployment_id)
    source = _restore_source(store, deployments, job, restore, progress, exclude=deployment_id)
    plan = plan_restore(store, job.name, source.id, open_storage(deployment.checkpoint)) if source else None
    if plan is not None:
        execute_restore(store, plan, progress=progress)
        deployment.restored_from, deployment.restored_batch_id = source.id, source.batch_id
        deployment.spark_conf = {**deployment.spark_conf, **plan.spark_conf}
    deployments.put(deployment)
    conf = {k: v for k, v in (plan.spark_conf if plan else {}).items() if k.startswith("spark.sql.")}
    deployments.request(job.name, deployment_id, ControlRequest(id=new_request_id(), action="start", conf=conf))
    _wait_until_started(deployments, deployment, wait_seconds)
    return deployment


def submit_spec(
    job: JobSpec,
    version: VersionSpec,
    deployment_id: str,
    checkpoint: str,
    conf: dict[str, str],
    runtime_args: tuple[str, ...] = (),
) -> SubmitSpec:
    """The spark-submit of a job version under the runtime (spark_jobs/runtime/args.py)."""
    return SubmitSpec(
        application=version.application,
        app_args=[
            "--store",
            job.store,
            "--job",
            job.name,
            "--deployment",
            deployment_id,
            "--checkpoint",
            checkpoint,
            "--trigger-interval",
            job.trigger_interval,
            "--delivery",
            job.delivery,
            *runtime_args,
            *job.args,
            *version.args,
        ],
        master=job.spark_master,
        deploy_mode=job.deploy_mode,
        name=f"{job.name}-{version.name}-{deployment_id}",
        conf=conf,
    )


def _wait_until_started(deployments: Deployments, deployment: Deployment, wait_seconds: float) -> None:
    """Return once the job reports RUNNING; fail with the job's own error if it fails or exits first."""
    if wait_seconds <= 0:
        return  # the caller watches health itself (an upgrade's health gate)
    _wait_for(deployments, deployment, (State.RUNNING, State.STOPPING, State.STOPPED), wait_seconds, "RUNNING")


def _wait_for(
    deployments: Deployments, deployment: Deployment, states: tuple[State, ...], wait_seconds: float, what: str
) -> None:
    """Return once the job reports one of `states`; fail with its own error if it fails or exits first."""
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        status = deployments.status(deployment.job, deployment.id)
        if status is not None and status.state in states:
            return
        if status is not None and status.state is State.FAILED:
            raise LaunchFailed(
                f"deployment {deployment.id} of job {deployment.job} FAILED: {status.error_class or ''} "
                f"{status.error_message or ''}".strip()
            )
        code = exit_code(deployment.launcher)
        if code is not None:
            status = deployments.status(deployment.job, deployment.id)
            if status is not None and status.state is State.FAILED:
                continue  # report the job's own error on the next round
            tail = log_tail(deployment.launcher)
            deployments.write_status(
                deployment.job,
                deployment.id,
                Status(state=State.FAILED, updated_at=time.time(), error_class="LAUNCH_FAILED", error_message=tail),
            )
            raise LaunchFailed(
                f"deployment {deployment.id} of job {deployment.job}: spark-submit exited with code {code} before "
                f"the job started; log {deployment.launcher.get('log')}:\n{tail}"
            )
        time.sleep(0.1)
    log.warning(
        "deployment %s has not reported %s after %.0fs; it may still be starting", deployment.id, what, wait_seconds
    )
