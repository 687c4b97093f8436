"""Deploy a job version as a new deployment with its own checkpoint location, optionally from state:

    latest-state      the default (DEFAULT_RESTORE, the CLI's, the operator's and the deploy DAG's): the newest
                      of the previous deployment's live checkpoint and the job's snapshots (the live checkpoint
                      is snapshotted first, so it is never claimed by the new one); a job that never committed a
                      batch (no snapshot, no earlier checkpoint with a committed batch) has no state to lose: it
                      starts fresh, and its deployment records why (`fresh_start`). A job that had state it cannot
                      take over is refused (NoState): starting it fresh would silently drop what it had
    none              a fresh start, asked for by name: of a job with state it logs and records (`fresh_start`)
                      what is not carried over, the state latest-state would have continued from and its batch
    latest-savepoint  the newest COMPLETED savepoint of the job
    <snapshot id>     that snapshot

Observe (deployments, heartbeats, snapshots) -> decide (refusals, restore source) -> act (restore,
launch, wait until the job runs or fails).

The decisions every launch shares (refusals, restore source, location claims, the submit, launch and wait) are
here, public: an upgrade's launches of a new version while the old one runs (core/upgrades/launch.py: beside it,
or pre-started and activated) make the same ones."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import CheckpointError, InvalidInput, NoState, NotFound, Refused
from ..guards.sink import execute_rewind
from ..process import Liveness
from ..records.deployment import Deployment, DeploymentStatus, State, new_deployment_id
from ..records.manifest import Kind, Manifest, SnapshotStatus, Trigger
from ..snapshots.checkpoint import read_restart_point
from ..snapshots.restore import RestorePlan, execute_restore, plan_restore
from ..spark_app import fenced_conf, tool_path
from ..timestamps import utc_now
from .context import JobContext
from .fence import admit, fence_interval
from .fresh_start import build_of, code_digest, fresh_start
from .launcher import SubmitSpec, process_seen
from .observe import state_of
from .operation import operation
from .rescale import PARTITIONS_CONF, check_rescalable, current_partitions, log_repartition_batch, repartition
from .snapshot import snapshot_deployment
from .spec import DEFAULT_RESTORE, VersionSpec
from .startup import launch_deployment, wait_until_started

log = logging.getLogger(__name__)

RESTORE_HELP = (  # what the CLI's --restore and the deploy DAG's form field say
    f"{DEFAULT_RESTORE} (the default: a job with history continues from its latest state, one that never committed a "
    "batch starts fresh), latest-savepoint, a snapshot id (sp-... / ck-...), or none: start empty (of a job with "
    "state it says which state, at which batch, is not carried over)"
)


@dataclass(frozen=True)
class DeployRequest:
    version: str | None = None
    restore: str = DEFAULT_RESTORE
    partitions: int | None = None  # state partitions; differs from the snapshot's: rescale (repartition)
    wait_seconds: float = 180.0  # until the job reports RUNNING (Spark start-up on a busy machine); 0: do not wait
    rewind_sink: bool = False  # a sink ahead of the snapshot is rewound to it instead of refusing
    accept_source_gap: bool = False  # restore even if Kafka no longer holds records after the snapshot (recorded)


def live_deployments(ctx: JobContext, listed: list[Deployment] | None = None) -> list[tuple[Deployment, State]]:
    """Deployments that run or may still run (LOST: no heartbeat, but perhaps alive elsewhere), of `listed`: the
    job's deployments as the caller read them (else read here)."""
    found = []
    for deployment in ctx.deployments.list(ctx.name) if listed is None else listed:
        state = state_of(ctx, deployment)
        if state.live or state is State.LOST:
            found.append((deployment, state))
    return found


FIRST_DEPLOYMENT = (
    "latest-state of a job that never started a query: no snapshot, and no earlier deployment started one (their "
    "checkpoints are empty)"
)


def restore_source(ctx: JobContext, mode: str, listed: list[Deployment], exclude: str | None = None) -> Manifest | None:
    """The snapshot a deployment starts from; None for a fresh start (see `first_deployment`). `listed`: the
    job's deployments, as read under its lease. `exclude`: the deployment being activated (its empty location
    is no source)."""
    if mode == "none" or first_deployment(ctx, mode, listed, exclude):
        return None
    if mode == "latest-savepoint":
        return ctx.store.latest(ctx.name, kind=Kind.SAVEPOINT)
    if mode != "latest-state":
        return ctx.store.get(ctx.name, mode)
    latest = latest_state(ctx, listed, exclude)
    if latest.live is not None:
        last, batch = latest.live
        log.info("latest state is the live checkpoint of %s at batch %d: snapshotting it", last.id, batch)
        return snapshot_deployment(
            ctx,
            last,
            kind=Kind.CHECKPOINT,
            trigger=Trigger.UPGRADE,
            labels={"reason": "latest-state"},
            requested_by="deploy --restore latest-state",
        )
    if latest.snapshot is None:
        previous = [d for d in listed if d.id != exclude]
        what = f"{len(previous)} earlier deployment(s)" if previous else "snapshots"
        raise NoState(
            f"job {ctx.name} has {what} but no state to take over: no COMPLETED snapshot (`savepoints list "
            f"{ctx.name}`), and no committed batch in the last deployment's checkpoint"
        )
    return latest.snapshot


class LatestState(NamedTuple):
    """What latest-state continues from: the newest COMPLETED snapshot (of the last deployment's query, when its
    checkpoint has a committed batch), or that deployment's live checkpoint where it is newer (`live`: the
    deployment and the batch it committed last). Neither: the job has no state."""

    snapshot: Manifest | None
    live: tuple[Deployment, int] | None = None

    def describe(self) -> str | None:
        if self.live is not None:
            deployment, batch = self.live
            return f"the live checkpoint of deployment {deployment.id} ({deployment.version}) at batch {batch}"
        if self.snapshot is not None:
            return f"{self.snapshot.kind} {self.snapshot.id} at batch {self.snapshot.batch_id}"
        return None


def latest_state(ctx: JobContext, listed: list[Deployment], exclude: str | None = None) -> LatestState:
    """The job's latest state, read and not touched (`listed`, `exclude`: as `restore_source` takes them)."""
    try:
        newest = ctx.store.latest(ctx.name)
    except NotFound:
        newest = None
    previous = [d for d in listed if d.id != exclude and not d.aborted_by]  # an aborted green held nothing of it
    if not previous:
        return LatestState(newest)
    last = previous[-1]
    try:
        live = read_restart_point(ctx.open(last.checkpoint))
    except (NotFound, CheckpointError):
        return LatestState(newest)
    # a snapshot is the latest state only if it is of the same query and no older: after a rollback the newest
    # snapshot may be of the version that was rolled back, its batch ids higher, its output undone
    newest = _newest_of_query(ctx, live.query_id)
    if newest is None or (newest.batch_id or -1) < live.batch_id:
        return LatestState(newest, (last, live.batch_id))
    return LatestState(newest)


def why_fresh(ctx: JobContext, restore: str, listed: list[Deployment], exclude: str | None = None) -> str | None:
    """Why a deployment starts with no state, recorded with it (`fresh_start`): latest-state of a job that never
    ran, or a fresh start asked for by name (`none`) of a job with state, saying which state is not carried over."""
    if restore == "latest-state":
        return FIRST_DEPLOYMENT
    discarded = latest_state(ctx, listed, exclude).describe()
    return f"restore none: the job's latest state, {discarded}, is not carried over" if discarded else None


def log_fresh(ctx: JobContext, deployment: Deployment) -> None:
    """A fresh start that leaves state behind is a warning (the CLI shows it, the task log has it)."""
    if deployment.fresh_start:
        level = logging.INFO if deployment.fresh_start == FIRST_DEPLOYMENT else logging.WARNING
        log.log(level, "deployment %s of job %s starts fresh: %s", deployment.id, ctx.name, deployment.fresh_start)


def first_deployment(ctx: JobContext, mode: str, listed: list[Deployment], exclude: str | None = None) -> bool:
    """latest-state for a job that never started a query: no snapshot of any status, and no deployment in `listed`
    (but `exclude`) that ever did (a first deploy, or earlier ones refused before their query started: a launch
    that failed, arguments or a guarantee refused, a sink ahead). There is no state to lose, so the deployment starts
    fresh; the sink guard still checks its sink. A query that started and failed before its first commit has
    state all the same: the source positions it began at (Kafka's `latest` of then) are in its checkpoint."""
    if mode != "latest-state" or ctx.store.list(ctx.name):
        return False
    return not any(_started(ctx, d) for d in reversed(listed) if d.id != exclude)


def _started(ctx: JobContext, deployment: Deployment) -> bool:
    """Whether a deployment ever started its query: its heartbeat named one, or its checkpoint holds anything (Spark
    writes its `metadata` first, then the sources' initial positions and batch 0's offsets)."""
    status = ctx.deployments.status(ctx.name, deployment.id)
    if status is not None and (status.query_id or status.last_batch_id is not None):
        return True
    return next(iter(ctx.open(deployment.checkpoint).list("")), None) is not None


def _newest_of_query(ctx: JobContext, query_id: str) -> Manifest | None:
    """The newest COMPLETED snapshot of one query (its checkpoint's id: a restore with a rewound sink, like a
    rollback's, gives the restored query a new one)."""
    same = [e for e in ctx.store.list(ctx.name) if e.status is SnapshotStatus.COMPLETED and e.query_id == query_id]
    return ctx.store.get(ctx.name, same[-1].id) if same else None


def plan_from(
    ctx: JobContext,
    source: Manifest | None,
    checkpoint: str,
    rewind_sink: bool,
    accept_source_gap: bool,
    onto: str | None = None,
) -> RestorePlan | None:
    if source is None:
        return None
    return plan_restore(
        ctx.store,
        ctx.name,
        source,
        ctx.open(checkpoint),
        rewind_sink=rewind_sink,
        open_location=ctx.open,
        kafka=ctx.kafka,
        accept_source_gap=accept_source_gap,
        onto=onto,
        spark=ctx.spark_access(),
    )


def deploy(ctx: JobContext, request: DeployRequest) -> Deployment:
    """Under the job's lease: two deploys of one job never both start. Bad input fails before the lease."""
    version = ctx.spec.launchable(request.version)
    if request.partitions is not None and request.partitions < 1:
        raise InvalidInput(f"cannot deploy with {request.partitions} state partitions: give a positive number")
    with operation(ctx, "deploy") as found:
        return _deploy(ctx, request, version, deployments_listed(ctx, found))


def deployments_listed(ctx: JobContext, found: list[Deployment] | None) -> list[Deployment]:
    """The job's deployments under its lease: as the operation found them on taking it, read in a nested one
    (see jobs/operation.py). The steps of one deploy decide on this one read."""
    return ctx.deployments.list(ctx.name) if found is None else found


class DeployPlan(NamedTuple):
    """What a deploy decided before it writes its deployment: the deployment's id and location, the snapshot it
    starts from (None: fresh) and that snapshot's restore plan."""

    deployment_id: str
    checkpoint: str
    source: Manifest | None
    restore: RestorePlan | None


def plan_deploy(ctx: JobContext, request: DeployRequest, listed: list[Deployment]) -> DeployPlan:
    """Under the job's lease, `listed` its deployments as read under it: refused while one may still run, the
    snapshot to start from (latest-state of a newer live checkpoint: that checkpoint snapshotted first), a
    location of its own, the restore's plan (bench/deploy_plan.py measures it)."""
    refuse_while_live(ctx, listed)
    source = restore_source(ctx, request.restore, listed)
    deployment_id = new_deployment_id()
    checkpoint = claimable_location(ctx, deployment_id, listed)
    plan = plan_from(ctx, source, checkpoint, request.rewind_sink, request.accept_source_gap)
    return DeployPlan(deployment_id, checkpoint, source, plan)


def _deploy(ctx: JobContext, request: DeployRequest, version: VersionSpec, listed: list[Deployment]) -> Deployment:
    earlier = earlier_attempt(ctx, listed)
    if earlier is not None:  # this request's process died after launching: the driver it started goes on
        wait_until_started(ctx, earlier, request.wait_seconds)
        return earlier
    deployment_id, checkpoint, source, plan = plan_deploy(ctx, request, listed)
    build = build_of(ctx, version)
    fresh_rewinds = fresh_start(ctx, build, deployment_id, request.rewind_sink) if source is None else []
    rescale_to = None
    if source and request.partitions and request.partitions != current_partitions(source):
        check_rescalable(source, request.partitions)  # before anything is written
        rescale_to = request.partitions

    deployment = Deployment(
        id=deployment_id,
        job=ctx.name,
        version=version.name,
        checkpoint=checkpoint,
        restored_from=source.id if source else None,
        restored_batch_id=source.batch_id if source else None,
        spark_conf={**ctx.spec.conf, **version.conf, **(plan.spark_conf if plan else {})},
        request_id=ctx.settings.request_id,
        source_gap=plan.source_gap if plan else None,
        build=build,
        code_digest=code_digest(version),
        fresh_start=why_fresh(ctx, request.restore, listed) if source is None else None,
        master=ctx.spec.spark_master,
    )
    log_fresh(ctx, deployment)
    if request.partitions:
        deployment.spark_conf[PARTITIONS_CONF] = str(request.partitions)
    ctx.deployments.put(deployment)  # claims the location before anything is written there
    for storage, rewind in fresh_rewinds:
        ctx.progress.stage(f"rewinding sink {storage.uri} for a fresh start")
        execute_rewind(storage, rewind)
    if plan is not None:
        execute_restore(ctx.store, plan, progress=ctx.progress)
        if rescale_to is not None:
            repartition_restored(ctx, plan, deployment, rescale_to)
            ctx.deployments.put(deployment)  # the batch it restarts after is the repartition's

    spec = submit_spec(ctx, version, deployment_id, checkpoint, deployment.spark_conf, gate_args(source))
    admit(ctx, deployment)  # the job's one writer from now on: any driver before it commits nothing more
    launch_deployment(ctx, deployment, spec)
    wait_until_started(ctx, deployment, request.wait_seconds)
    return deployment


# of a deployment's confs, what says where and with what its driver and executors run: the repartition is a Spark
# tool of the deciding process (spark_app.py), on its own master, not the job's cluster
CLUSTER_ONLY = (
    "spark.master",
    "spark.submit.",
    "spark.pyspark.",
    "spark.archives",
    "spark.files",
    "spark.yarn.",
    "spark.kubernetes.",
    "spark.executor.",
    "spark.executorEnv.",
    "spark.dynamicAllocation.",
    "spark.driver.extra",
    "spark.ui.",
)


def repartition_restored(ctx: JobContext, plan: RestorePlan, deployment: Deployment, partitions: int) -> None:
    """The state just restored into `deployment`'s location repartitioned to `partitions` (a Spark application,
    before its query starts; `check_rescalable` said yes before anything was written)."""
    ctx.progress.stage(f"repartitioning the restored state to {partitions} partitions (a Spark application)")
    conf = repartition_conf(ctx, deployment, plan.spark_conf)
    batch = repartition(plan.target, conf, partitions, env=ctx.child_env())
    logged = log_repartition_batch(plan.manifest, batch, ctx.open, conf)
    deployment.spark_conf[PARTITIONS_CONF] = str(partitions)
    deployment.restored_batch_id = batch  # its own batches (the health gate's) come after the repartition's
    log.info(
        "rescaled the state of %s to %d partitions (batch %d; logged in %s)", deployment.id, partitions, batch, logged
    )


def repartition_conf(ctx: JobContext, deployment: Deployment, restored: dict[str, str]) -> dict[str, str]:
    """The confs a repartition runs with and logs its batch by: the engine's (jars, S3A), the deployment's own (its
    jars and state store classes, its driver's memory; the sink's log compacts at the job's
    `fileSink.log.compactInterval`, which Spark does not pin in the checkpoint), and what the restored checkpoint
    pins. Not where the job runs or with which Python (CLUSTER_ONLY: a YARN job's `spark.pyspark.python =
    ./environment/bin/python` failed the tool with error=2)."""
    own = {key: value for key, value in deployment.spark_conf.items() if not key.startswith(CLUSTER_ONLY)}
    return {**ctx.spark_conf(), **own, **restored}


def gate_args(source: Manifest | None, staging: str | None = None) -> tuple[str, ...]:
    """The runtime's gate options (spark_jobs/runtime/gate.py): what a restore keeps of the interval a gated
    snapshot's deployment wrote (Manifest.restored_gate); and for a blue/green upgrade's new version, the table it
    stages into."""
    interval = (source.restored_gate if source else None) or {}
    args = [arg for name, bound in interval.items() for arg in (f"--gate-{name}", str(bound))]
    return (*args, *(("--gate-staging", staging) if staging else ()))


def earlier_attempt(ctx: JobContext, listed: list[Deployment]) -> Deployment | None:
    """The deployment an earlier attempt of this same request made (a retried Airflow task whose worker
    died), of `listed`: one it launched is taken over; one it recorded but never launched is marked FAILED
    so that it does not read as starting (retired in `listed` too), and the retry deploys anew."""
    request_id = ctx.settings.request_id
    if not request_id:
        return None
    for deployment in reversed(listed):
        if deployment.request_id != request_id:
            continue
        state = state_of(ctx, deployment)
        if deployment.launcher and state.live:
            log.info("request %s: taking over deployment %s (%s)", request_id, deployment.id, state)
            return deployment
        if not deployment.launcher and not deployment.retired_at:
            abandoned = DeploymentStatus(
                State.FAILED,
                time.time(),
                error_class="ABANDONED",
                error_message=f"the attempt that recorded it died before launching; request {request_id} was retried",
            )
            ctx.deployments.write_status(ctx.name, deployment.id, abandoned)
            deployment.retired_at = utc_now()
            ctx.deployments.put(deployment)
    return None


def refuse_while_live(ctx: JobContext, listed: list[Deployment], besides: str | None = None) -> None:
    for deployment, state in live_deployments(ctx, listed):
        if deployment.id == besides:
            continue
        gone = process_seen(deployment.launcher) is Liveness.GONE
        if state.live or not gone:  # a LOST one elsewhere might still write the sink
            raise Refused(
                f"job {ctx.name} already has deployment {deployment.id} in state {state}: stop it first "
                f"(`savepoints stop {ctx.name}`) or, if it is LOST and surely not running, `savepoints kill {ctx.name}`"
            )


def claimable_location(ctx: JobContext, deployment_id: str, listed: list[Deployment]) -> str:
    """The new deployment's location, if no deployment in `listed` owns it and it is empty."""
    checkpoint = ctx.checkpoint_location(deployment_id)
    owners = [d.id for d in listed if d.checkpoint.rstrip("/") == checkpoint]
    if owners or ctx.open(checkpoint).exists():
        owner = f"owned by deployment {', '.join(owners)}" if owners else "not empty"
        raise Refused(f"checkpoint location {checkpoint} is {owner}: every deployment needs its own; nothing done")
    return checkpoint


def submit_spec(
    ctx: JobContext,
    version: VersionSpec,
    deployment_id: str,
    checkpoint: str,
    conf: dict[str, str],
    runtime_args: tuple[str, ...] = (),
    *,
    lasting: bool = True,
) -> SubmitSpec:
    """The spark-submit of a job version under the runtime (spark_jobs/runtime/args.py); a script version's
    driver is the runtime's script runner, told which script to run (and what the version declares of it). The
    job's own arguments are the jobs file's, nothing added: the engine's settings (the broker of a job that declares
    `kafka`) reach the driver in its conf and environment (JobContext.child_conf, child_env). `lasting`: a
    deployment's driver (the default), which runs for weeks; False for a run that ends within the command."""
    job = ctx.spec
    return SubmitSpec(
        application=str(tool_path("run_script")) if version.script else version.application,
        app_args=[
            *(("--script", version.script) if version.script else ()),
            *(("--script-start-timeout", version.start_timeout) if version.start_timeout else ()),
            *(("--script-foreach-batch", version.foreach_batch) if version.foreach_batch else ()),
            "--store",
            ctx.store.uri,
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
            *(("--fence-interval", f"{fence_interval(job.heartbeat_timeout):g}") if lasting else ()),
            *runtime_args,
            *job.args,
            *version.args,
        ],
        master=job.spark_master,
        deploy_mode=job.deploy_mode,
        name=f"{job.name}-{version.name}-{deployment_id}",
        conf=fenced_conf({**ctx.spark_conf(), **ctx.child_conf(), **conf})
        if lasting
        else {
            **ctx.spark_conf(),
            **ctx.child_conf(),
            **conf,
        },
        env=ctx.child_env(lasting=lasting),
    )
