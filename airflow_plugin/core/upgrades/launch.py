"""An upgrade's launches of a new version while the old one still runs, with the decisions every deploy makes
(core/jobs/deploy.py):

    launch_beside   blue/green, replay, migration: the new version (green) beside the old one, restored from its
                    live savepoint or started fresh at a seed, writing into a staging table until it publishes
    prestart        stop-and-restore: the new driver launched in STANDBY while the old version runs: it creates
                    its Spark session (the slow part of a start), and the upgrade's live savepoint can already be
                    restored into its location
    activate        once the old version stopped: the state restored into the pre-started location (only what
                    changed since the pre-restore) and its query started; the downtime no longer includes the JVM
                    and session start-up, nor moving the bulk of the state

Each runs under the job's lease (jobs/operation.py): the upgrade holds it, so these nest in it."""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Any

from ..errors import NotReady, Refused
from ..guards.sink import execute_rewind
from ..jobs.context import JobContext
from ..jobs.deploy import (
    claimable_location,
    deployments_listed,
    earlier_attempt,
    gate_args,
    live_deployments,
    log_fresh,
    plan_from,
    refuse_while_live,
    repartition_restored,
    restore_source,
    submit_spec,
    why_fresh,
)
from ..jobs.deployments import new_request_id
from ..jobs.fence import admit
from ..jobs.fresh_start import build_of, code_digest, fresh_start
from ..jobs.observe import state_of
from ..jobs.operation import operation
from ..jobs.rescale import check_rescalable, current_partitions
from ..jobs.spec import VersionSpec
from ..jobs.startup import launch_deployment, wait_for_state, wait_until_started
from ..jobs.stop import kill
from ..records.deployment import ControlRequest, Deployment, State, new_deployment_id
from ..records.manifest import Manifest
from ..snapshots.restore import METADATA, execute_restore, plan_restore
from ..timestamps import utc_now


def launch_beside(
    ctx: JobContext,
    version_name: str,
    snapshot_id: str,
    staging: str,
    *,
    fresh: bool = False,
    seed: dict[str, Any] | None = None,
    initial_state: str | None = None,
    wait_seconds: float = 180.0,
    partitions: int | None = None,
) -> Deployment:
    """A deployment of a version beside the running one (an upgrade's green), writing into `staging` until it
    publishes (its runtime checks its sink before its query starts), under a query id of its own (sinks tell the
    two apart by it). Restored from the running one's live savepoint `snapshot_id`, its Kafka positions checked
    like any restore's; or, `fresh`, on an empty checkpoint: started at `seed`'s positions (the runtime's
    `--seed`: a replay's or a migration's start) with `initial_state` (a migration's), or from the start of its
    sources. `partitions`: the restored state repartitioned to these before the query starts (a rescale). Under the
    job's lease: the upgrade holds it."""
    version = ctx.spec.launchable(version_name)
    with operation(ctx, "deploy") as found:
        listed = deployments_listed(ctx, found)
        earlier = earlier_attempt(ctx, listed)
        if earlier is not None:
            wait_until_started(ctx, earlier, wait_seconds)
            return earlier
        source = ctx.store.get(ctx.name, snapshot_id)
        rescale_to = _rescale_to(source, None if fresh else partitions)
        deployment_id = new_deployment_id()
        checkpoint = claimable_location(ctx, deployment_id, listed)
        plan, conf = None, {**ctx.spec.conf, **version.conf}
        if not fresh:
            plan = plan_restore(
                ctx.store,
                ctx.name,
                source,
                ctx.open(checkpoint),
                check_sinks=False,  # it writes its staging table; the live table is the old version's until the cutover
                open_location=ctx.open,
                kafka=ctx.kafka,
                new_query_id=True,
            )
            conf |= plan.spark_conf
        deployment = Deployment(
            id=deployment_id,
            job=ctx.name,
            version=version.name,
            checkpoint=checkpoint,
            restored_from=None if fresh else source.id,
            restored_batch_id=(0 if seed else None) if fresh else source.batch_id,
            spark_conf=conf,
            request_id=ctx.settings.request_id,
            source_gap=plan.source_gap if plan else None,
            build=build_of(ctx, version),
            code_digest=code_digest(version),
            master=ctx.spec.spark_master,
        )
        ctx.deployments.put(deployment)
        args = gate_args(source, staging)
        if plan is not None:
            execute_restore(ctx.store, plan, progress=ctx.progress)
            if rescale_to is not None:
                repartition_restored(ctx, plan, deployment, rescale_to)
                ctx.deployments.put(deployment)
        else:  # its own query id from the start: the runtime's sink check and Delta's txn tell it apart
            ctx.open(checkpoint).write(METADATA, json.dumps({"id": str(uuid.uuid4())}).encode())
            args += ("--seed", json.dumps(seed, separators=(",", ":"))) if seed else ()
            args += ("--initial-state", initial_state) if initial_state else ()
        spec = submit_spec(ctx, version, deployment_id, checkpoint, deployment.spark_conf, args)
        # a writer beside the old version, whose gate keeps their windows apart (runtime/gate.py): the old one stays a
        # writer even while LOST (paused, say): the upgrade's own steps decide what becomes of it, not its green
        admit(ctx, deployment, beside=[d.id for d, _ in live_deployments(ctx, listed)])
        launch_deployment(ctx, deployment, spec)
        wait_until_started(ctx, deployment, wait_seconds)
        return deployment


def prestart(
    ctx: JobContext,
    version_name: str | None,
    *,
    wait_seconds: float = 180.0,
    prerestore: str | None = None,
    upgrade: str | None = None,
) -> Deployment:
    """Launch a version's driver in STANDBY next to the running deployment; returns once it is ready, and raises
    NotReady when it is not within `wait_seconds` (it runs on: nothing may be stopped for it yet).
    `prerestore`: a snapshot restored into its location meanwhile (while its JVM starts), so that
    `activate` moves only what changed since. No sink is checked or rewound here: the old version still
    runs; `activate` guards the sink against the snapshot it starts from. A retry of the same request (an upgrade's
    step, an Airflow task) takes over the standby its killed try launched (`upgrade`: the upgrade it is for)."""
    version = ctx.spec.launchable(version_name)
    with operation(ctx, "deploy") as found:
        listed = deployments_listed(ctx, found)
        earlier = _earlier_standby(ctx, listed, prerestore, upgrade)
        standby = earlier if earlier is not None else _prestart(ctx, version, prerestore, listed)
        if not wait_for_state(ctx, standby, (State.STANDBY,), wait_seconds, "STANDBY"):
            raise NotReady(
                f"deployment {standby.id} of job {ctx.name} did not reach STANDBY within {wait_seconds:.0f} s (it is "
                f"{state_of(ctx, standby)}: its Spark session or warm-up still runs); nothing was stopped for it. Wait "
                "longer (an upgrade's start timeout), or stop it",
                standby.id,
            )
        return standby


def _earlier_standby(
    ctx: JobContext, listed: list[Deployment], prerestore: str | None, upgrade: str | None
) -> Deployment | None:
    """The standby an earlier try of this request launched before it was killed (its upgrade does not name it yet),
    taken over once its pre-restore was recorded. One killed during its pre-restore (its location holds part of it)
    is ended and retired, marked aborted by `upgrade` (the job's latest state is not in it), and launched anew."""
    earlier = earlier_attempt(ctx, listed)
    if earlier is None or earlier.prerestored_from == prerestore:
        return earlier
    with contextlib.suppress(Refused):  # it ended meanwhile
        kill(ctx, earlier.id)
    earlier = ctx.deployments.get(ctx.name, earlier.id)
    earlier.retired_at, earlier.aborted_by = utc_now(), upgrade
    ctx.deployments.put(earlier)
    return None


def _prestart(ctx: JobContext, version: VersionSpec, prerestore: str | None, listed: list[Deployment]) -> Deployment:
    for other, state in live_deployments(ctx, listed):
        if state is State.STANDBY:
            raise Refused(f"job {ctx.name} already has a pre-started deployment {other.id}: activate or stop it first")
    deployment_id = new_deployment_id()
    checkpoint = claimable_location(ctx, deployment_id, listed)
    deployment = Deployment(
        id=deployment_id,
        job=ctx.name,
        version=version.name,
        checkpoint=checkpoint,
        spark_conf={**ctx.spec.conf, **version.conf},
        request_id=ctx.settings.request_id,
        build=build_of(ctx, version),
        code_digest=code_digest(version),
        master=ctx.spec.spark_master,
    )
    ctx.deployments.put(deployment)
    launch_deployment(
        ctx, deployment, submit_spec(ctx, version, deployment_id, checkpoint, deployment.spark_conf, ("--standby",))
    )
    if prerestore:  # the driver does not touch its location before a start request
        plan = plan_restore(
            ctx.store, ctx.name, prerestore, ctx.open(checkpoint), check_sinks=False, check_sources=False
        )
        execute_restore(ctx.store, plan, progress=ctx.progress)
        deployment.prerestored_from = plan.manifest.id
        ctx.deployments.put(deployment)
    return deployment


def activate(
    ctx: JobContext,
    deployment_id: str,
    restore: str,
    *,
    wait_seconds: float = 180.0,
    rewind_sink: bool = False,
    accept_source_gap: bool = False,
    partitions: int | None = None,
) -> Deployment:
    """Restore state into a pre-started deployment's location and start its query. Refused while any
    other deployment of the job is live (stop the old version first) or if it is not in STANDBY. `partitions`: the
    restored state repartitioned to these before the query starts (a rescale)."""
    with operation(ctx, "deploy") as found:
        listed = deployments_listed(ctx, found)
        return _activate(ctx, deployment_id, restore, wait_seconds, rewind_sink, accept_source_gap, listed, partitions)


def _activate(
    ctx: JobContext,
    deployment_id: str,
    restore: str,
    wait_seconds: float,
    rewind_sink: bool,
    accept_source_gap: bool,
    listed: list[Deployment],
    partitions: int | None = None,
) -> Deployment:
    deployment = ctx.deployments.get(ctx.name, deployment_id)
    state = state_of(ctx, deployment)
    if state is not State.STANDBY:
        raise Refused(
            f"deployment {deployment_id} of job {ctx.name} is {state}, not a pre-started driver in STANDBY; "
            f"deploy normally (`savepoints deploy {ctx.name} --restore {restore}`)"
        )
    refuse_while_live(ctx, listed, besides=deployment_id)
    source = restore_source(ctx, restore, listed, exclude=deployment_id)
    if source is None and deployment.prerestored_from:
        raise Refused(
            f"deployment {deployment_id} holds a restore of snapshot {deployment.prerestored_from}: it cannot "
            "start with no state; activate it with a snapshot, or stop it and deploy anew"
        )
    plan = plan_from(ctx, source, deployment.checkpoint, rewind_sink, accept_source_gap, deployment.prerestored_from)
    rescale_to = _rescale_to(source, partitions)
    if source is None:
        for storage, rewind in fresh_start(ctx, deployment.build, deployment.id, rewind_sink):
            execute_rewind(storage, rewind)
        deployment.fresh_start = why_fresh(ctx, restore, listed, exclude=deployment_id)
        log_fresh(ctx, deployment)
    if plan is not None and source is not None:
        execute_restore(ctx.store, plan, progress=ctx.progress)
        deployment.restored_from, deployment.restored_batch_id = source.id, source.batch_id
        deployment.source_gap = plan.source_gap
        deployment.spark_conf = {**deployment.spark_conf, **plan.spark_conf}
        if rescale_to is not None:
            repartition_restored(ctx, plan, deployment, rescale_to)
    ctx.deployments.put(deployment)
    conf = {k: v for k, v in (plan.spark_conf if plan else {}).items() if k.startswith("spark.sql.")}
    gate = source.restored_gate if source else None  # what the restored deployment writes of a gated one's windows
    admit(ctx, deployment)  # the old version stopped: the job's one writer from now on
    start = ControlRequest(id=new_request_id(), action="start", conf=conf, gate=gate)
    ctx.deployments.request(ctx.name, deployment_id, start)
    wait_until_started(ctx, deployment, wait_seconds)
    return deployment


def _rescale_to(source: Manifest | None, partitions: int | None) -> int | None:
    """The partitions a rescale repartitions the restored state to, None when they are the snapshot's already;
    refused (before anything is written) where Spark cannot repartition the state."""
    if source is None or partitions is None or partitions == current_partitions(source):
        return None
    check_rescalable(source, partitions)
    return partitions
