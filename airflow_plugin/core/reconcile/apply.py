"""The reconcile loop's acting half: observe a declared job, plan its step (plan.py), carry it out through the
ordinary operations. A step that acts decides again under the job's lease (what it saw may have changed while it
waited for it), so a person's command and the loop never act on one job at once: whichever takes the lease first
acts, the other is refused. An upgrade takes the lease its own way (upgrades/run.py `begin`), after this one's
is released. What the loop did is recorded per job (record.py): restarts, the last stable version, a version
that failed, a person's pause."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..autoscale.decide import Recommendation, Rescale, ScalingSeen, StateSeen, rescale_request_id
from ..autoscale.policy import slots_per_unit
from ..errors import CheckpointError, NotFound, SavepointsError, UpgradeFailed
from ..jobs.context import Context, JobContext
from ..jobs.deploy import DeployRequest, deploy
from ..jobs.launcher import process_seen
from ..jobs.observe import observe_deployment
from ..jobs.operation import operation
from ..jobs.rescale import PARTITIONS_CONF, PROVIDER_CONF
from ..jobs.savepoint import take_savepoint
from ..jobs.stop import kill
from ..lease import default_holder
from ..process import Liveness
from ..records.deployment import Deployment, DeploymentStatus, State
from ..records.manifest import SnapshotStatus
from ..snapshots.checkpoint import read_restart_point
from ..timestamps import epoch_of, utc_now, utc_stamp
from ..upgrades.record import Phase, Upgrade, Upgrades
from ..upgrades.run import abandoned, abort_abandoned, begin, run_upgrade
from ..upgrades.steps import UpgradeSettings
from . import record as records
from .plan import APPLY, UPGRADES, Action, Observed, Seen, Step, UpgradeSeen, plan
from .record import Reconciled, Restart
from .scaling import describe_autoscale, rescale_sizes

log = logging.getLogger(__name__)
SPARK_DEFAULT_PARTITIONS = 200  # spark.sql.shuffle.partitions when a job sets none: what Spark pins in the checkpoint
KEPT_RESCALES = 50  # the rescales the record keeps (the hourly budget and the restart time read the newest)
# a rescale's health gate: its batches commit, whatever its Kafka lag does. A scale-up under a load still rising
# (or a scale-down, whose lag may rise a little) helps without the lag falling below its first batch's: the
# autoscaler's own effectiveness check judges the size (decide.py), the gate only that the job runs at it
RESCALE_GATE = UpgradeSettings(lag_must_fall=False)


# the outcome of a step decided again under the job's lease that no longer acts: nothing was done
CHANGED_MEANWHILE = "changed while the lease was taken: look again at the next apply"


@dataclass(frozen=True)
class Applied:
    step: Step
    outcome: str  # what was done, or why not
    error: SavepointsError | None = None  # why the step could not be carried out

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.step.job,
            "action": str(self.step.action),
            "reason": self.step.reason,
            "outcome": self.outcome,
            "ok": self.ok,
            **({"recommendation": self.step.recommendation.to_dict()} if self.step.recommendation else {}),
            **({"version": self.step.version} if self.step.version else {}),
            **({"not_before": self.step.not_before} if self.step.not_before else {}),
        }


def loop_context(ctx: JobContext) -> JobContext:
    """The job's context as the loop acts in it: its operations requested by `savepoints apply` (an upgrade it
    began is its own to resume), and a lease not kept past each operation."""
    who = ctx.settings.requested_by or default_holder()
    by = who if who.startswith(APPLY) else f"{APPLY} ({who})"
    return replace(ctx, settings=replace(ctx.settings, requested_by=by, keep_lease=False))


def observe(ctx: JobContext, now: float | None = None, listed: list[Deployment] | None = None) -> Observed:
    """What the plan needs of one job, read from the store (and the observer: heartbeats, processes, YARN)."""
    listed = ctx.deployments.list(ctx.name) if listed is None else listed
    deployments = [d for d in listed if not d.aborted_by]  # an aborted upgrade's new version: never the job's own
    looked = [_seen(ctx, d) for d in deployments]
    seen = [s for s, _ in looked]
    live = [s for s in seen if s.state.live]
    last = Upgrades(ctx.store.storage).newest(ctx.name)
    upgrade = last if last is not None and not last.phase.terminal else None
    newest = (live or seen or [None])[-1]
    record = records.read(ctx.store.storage, ctx.name)
    pending = record.rescales[-1] if record.rescales and record.rescales[-1].pending else None
    # the upgrade that carried the record's pending rescale and ended, its end not recorded on it (the apply killed)
    carried = last is not None and upgrade is None and pending is not None and last.request_id == pending.request_id
    now = time.time() if now is None else now
    scaling = None
    if newest is not None and newest.state is State.RUNNING:
        deployment, status = next((d, st) for (s, st), d in zip(looked, deployments, strict=True) if s is newest)
        scaling = scaling_seen(ctx, deployment, status, record, now)
    return Observed(
        job=ctx.name,
        desired=ctx.spec.desired,
        restart=ctx.spec.restart,
        fingerprint=ctx.spec.fingerprint,
        now=now,
        deployment=newest,
        upgrade=_upgrade_seen(ctx, upgrade) if upgrade is not None else None,
        record=record,
        scaling=scaling,
        rescale_upgrade=(last.id, str(last.phase)) if carried and last is not None else None,
    )


def scaling_seen(
    ctx: JobContext, deployment: Deployment, status: DeploymentStatus | None, record: Reconciled, now: float
) -> ScalingSeen | None:
    """What the autoscaler reads of the running deployment (None: the job declares no autoscale, or it runs
    another version than the desired one: an upgrade comes first)."""
    policy, desired = ctx.spec.autoscale, ctx.spec.desired
    if policy is None or desired is None or deployment.version != desired.version:
        return None
    knob = policy.knob_for(ctx.spec.spark_master)
    unit = slots_per_unit(knob, deployment.spark_conf)
    stateful = status is None or status.state_operators is None or bool(status.state_operators)  # unknown: state
    partitions = int(deployment.spark_conf.get(PARTITIONS_CONF) or SPARK_DEFAULT_PARTITIONS) if stateful else None
    repartitionable = False
    if partitions is not None and policy.max * unit > partitions:  # a size past them may come: what does Spark pin?
        pinned = _pinned(ctx, deployment)
        partitions = int(pinned.get(PARTITIONS_CONF) or partitions)
        # rescale.py check_rescalable's rule, before anything is stopped: only RocksDB state is repartitioned
        repartitionable = "RocksDB" in pinned.get(PROVIDER_CONF, "")
    return ScalingSeen(
        policy=policy,
        knob=knob,
        size=ctx.spec.size_of(deployment.master, deployment.spark_conf) or 1,
        slots_per_unit=unit,
        partitions=partitions,
        load=status.load if status is not None else [],
        now=now,
        history=record.rescales,
        ineffective_held=held(record, ctx.spec.fingerprint) is not None,
        repartitionable=repartitionable,
        state=_state_seen(ctx, deployment, status),
    )


def _state_seen(ctx: JobContext, deployment: Deployment, status: DeploymentStatus | None) -> StateSeen:
    """The deployment's state: its rows as its heartbeat reports them, its bytes and skew at its newest snapshot
    (what that snapshot recorded of its files; none before the deployment's first snapshot: a state repartitioned
    since an older one is spread otherwise)."""
    operators = (status.state_operators if status is not None else None) or []
    counted = [op["rows"] for op in operators if op.get("rows") is not None]
    rows = sum(counted) if counted else None
    own = [
        entry
        for entry in ctx.store.list(ctx.name)
        if entry.deployment == deployment.id and entry.status is SnapshotStatus.COMPLETED and entry.state
    ]
    if not own:
        return StateSeen(rows=rows)
    newest = own[-1]
    ratios = [op["skew"]["ratio"] for op in newest.state if (op.get("skew") or {}).get("ratio") is not None]
    return StateSeen(
        rows=rows,
        bytes=sum(int(op.get("bytes") or 0) for op in newest.state),
        skew=max(ratios) if ratios else None,
        snapshot=newest.id,
    )


def _pinned(ctx: JobContext, deployment: Deployment) -> dict[str, str]:
    """The confs Spark pinned in the deployment's checkpoint (its partitions, its state's provider): what a rescale's
    repartition will find there; nothing where it cannot be read now (the partitions are then kept)."""
    try:
        return read_restart_point(ctx.open(deployment.checkpoint)).spark_conf
    except (NotFound, CheckpointError):
        return {}


def held(record: Reconciled, fingerprint: str) -> str | None:
    """Why scale-ups are held, while they are: until `apply --retry` or a change of the jobs file."""
    return record.scale_up_held if record.scale_up_held_under == fingerprint else None


def _seen(ctx: JobContext, deployment: Deployment) -> tuple[Seen, DeploymentStatus | None]:
    status, state = observe_deployment(ctx, deployment)
    seen = Seen(
        id=deployment.id,
        version=deployment.version,
        state=state,
        error_class=status.error_class if status else None,
        error=status.error_message if status else None,
        updated_at=status.updated_at if status else None,
        last_batch_id=status.last_batch_id if status else None,
        gone=process_seen(deployment.launcher) is Liveness.GONE,
        size=ctx.spec.size_of(deployment.master, deployment.spark_conf),
    )
    return seen, status


def _upgrade_seen(ctx: JobContext, upgrade: Upgrade) -> UpgradeSeen:
    by_loop, left = upgrade.requested_by.startswith(APPLY), abandoned(ctx.store.storage, upgrade)
    return UpgradeSeen(upgrade.id, str(upgrade.phase), upgrade.to_version, by_loop, left)


def next_step(ctx: JobContext) -> Step:
    """The job's step as the loop sees it now (`ctx`: the loop's, `loop_context`)."""
    return plan(observe(ctx))


def apply_job(ctx: JobContext, *, dry_run: bool = False, step: Step | None = None) -> Applied:
    """One job's step, planned (unless `step`: planned already) and (unless `dry_run`) carried out."""
    ctx = loop_context(ctx)
    step = step or next_step(ctx)
    if dry_run or not step.action.acts:
        if not dry_run:
            _note(ctx, step)
        return Applied(step, "dry run: nothing done" if dry_run else "nothing to do")
    try:
        if step.action in UPGRADES:
            return _upgrade(ctx, step)
        with operation(ctx, "apply") as found:
            step = plan(observe(ctx, listed=found))  # decided again, under the lease
            if not step.action.acts or step.action in UPGRADES:
                return Applied(step, CHANGED_MEANWHILE)
            return _act(ctx, step)
    except SavepointsError as exc:
        log.warning("%s: %s failed: %s", ctx.name, step.action, exc)
        return Applied(step, f"{type(exc).__name__}: {exc}", exc)


def _act(ctx: JobContext, step: Step) -> Applied:
    record = records.read(ctx.store.storage, ctx.name)
    if step.action is Action.STOP:
        snapshot = take_savepoint(ctx, stop_after=True)
        return _done(ctx, record, step, f"stopped with savepoint {snapshot.id}")
    if step.action is Action.DEPLOY:
        deployment = deploy(ctx.at_size(step.size), DeployRequest(step.version, restore=step.restore or ""))
        return _done(ctx, record, step, f"deployed {step.version} as {deployment.id}")
    assert step.action is Action.RESTART and step.failed is not None
    failed = step.failed
    restart = next((r for r in record.restarts if r.failed == failed.id and r.pending), None)
    if restart is None:  # recorded before anything is done: a kill below is the loop's own, and counts once
        restart = Restart(time.time(), failed.id, step.reason, failed.last_batch_id)
        record.restarts.append(restart)
        records.write(ctx.store.storage, record)
    killed = None
    try:
        if step.kill_first:
            killed = kill(ctx, failed.id)
        deployment = deploy(ctx.at_size(step.size), DeployRequest(step.version, restore=step.restore or ""))
    except Exception as exc:
        # the attempt failed (the deploy refused: no state, a source gap; the kill): recorded with its error, it
        # counts against the budget and the next one waits its delay, instead of going on at every apply
        restart.error = f"{type(exc).__name__}: {exc}"
        try:
            _done(ctx, record, step, f"restart of {failed.id} failed: {restart.error}")
        except SavepointsError as unwritten:  # the store failing too: the attempt stays pending, tried again
            log.warning("%s: the failed restart is not recorded: %s", ctx.name, unwritten)
        raise
    restart.deployment = deployment.id
    first = f"{killed.said}; " if killed is not None else ""  # killed, or fenced where it could not be reached
    return _done(ctx, record, step, f"{first}restarted {failed.id} as {deployment.id} from its latest state")


def _upgrade(ctx: JobContext, step: Step) -> Applied:
    """Begin (or resume) the loop's upgrade and drive it to its end, outside this module's lease: the upgrade holds
    the job's lease its own way."""
    if step.action is Action.ABORT_UPGRADE:  # a person's, abandoned before its launch: not the version's failure
        aborted = abort_abandoned(ctx)
        if aborted is None:
            return Applied(step, "its approval was answered, or it ended, meanwhile")
        with operation(ctx, "apply"):
            said = f"upgrade {aborted.id} to {aborted.to_version} {aborted.phase}: {aborted.error}"
            return _done(ctx, records.read(ctx.store.storage, ctx.name), step, said)
    upgrade = upgrade_of(ctx, step)
    if upgrade is None:
        return Applied(step, CHANGED_MEANWHILE if step.action is Action.RESCALE else "the upgrade ended meanwhile")
    return upgrade_ended(ctx, run_upgrade(ctx, upgrade), step)


def upgrade_of(ctx: JobContext, step: Step) -> Upgrade | None:
    """The upgrade an UPGRADE step begins, or the one a RESUME_UPGRADE step goes on with (None: it ended meanwhile).
    `ctx`: the loop's (`loop_context`), so that the upgrade is recorded as the loop's own."""
    if step.action is Action.RESUME_UPGRADE:
        return Upgrades(ctx.store.storage).in_progress(ctx.name)
    assert step.action in (Action.UPGRADE, Action.RESCALE) and step.version is not None
    if step.action is Action.UPGRADE:
        return begin(ctx, step.version, mode=step.mode)
    again = _record_rescale(ctx)
    if again is None:
        return None
    step = again
    assert step.version is not None and step.rescaled_at is not None
    # begun under the rescale's own request: an apply that goes on with it after a kill adopts the upgrade it began
    request = rescale_request_id(step.rescaled_at)
    return begin(
        replace(ctx, settings=replace(ctx.settings, request_id=request)),
        step.version,
        mode=step.mode,
        settings=RESCALE_GATE,
        size=step.size,
        from_size=step.from_size,
        partitions=step.partitions,
    )


def _record_rescale(ctx: JobContext) -> Step | None:
    """A rescale decided again under the job's lease (two applies at once record one), and recorded before its
    upgrade begins: killed in between, it counts against the hourly budget and starts its cooldown, and the next
    apply goes on with it (plan.py: a rescale recorded already is not recorded again). None: no rescale is due any
    more."""
    with operation(ctx, "apply") as found:
        step = plan(observe(ctx, listed=found))
        if step.action is not Action.RESCALE:
            return None
        if step.rescaled_at is not None:
            return step
        assert step.recommendation is not None and step.size is not None and step.from_size is not None
        record = records.read(ctx.store.storage, ctx.name)
        rescale = Rescale(
            at=time.time(),
            from_size=step.from_size,
            to_size=step.size,
            reason=step.recommendation.reason,
            figures=step.recommendation.figures,
            partitions=step.partitions,
        )
        record.rescales = [*record.rescales, rescale][-KEPT_RESCALES:]
        record.rescales_total += 1
        record.recommendation = {"at": rescale.at, **step.recommendation.to_dict()}
        records.write(ctx.store.storage, record)
        return replace(step, rescaled_at=rescale.at)


def upgrade_ended(ctx: JobContext, ended: Upgrade, step: Step | None = None) -> Applied:
    """Record what the loop's upgrade came to: DONE, the version is the last stable one; anything else (rolled back,
    aborted, blocked), it is held under this declaration, and the step fails saying so. `step`: the one that began or
    resumed it (None: one that waited elsewhere, in Airflow's triggerer)."""
    step = step or Step(ctx.name, Action.UPGRADE, f"upgrade {ended.id} went on", version=ended.to_version)
    with operation(ctx, "apply"):
        record = records.read(ctx.store.storage, ctx.name)
        if rescale_sizes(ended) is not None:  # a rescale: the version is not in question
            return _rescale_ended(ctx, record, ended, step)
        if ended.phase is Phase.DONE:
            record.last_stable_version = ended.to_version
            record.failed_versions.pop(ended.to_version, None)
            return _done(ctx, record, step, f"upgraded to {ended.to_version} ({ended.mode}, upgrade {ended.id})")
        record.failed_versions[ended.to_version] = ctx.spec.fingerprint
        said = _done(ctx, record, step, f"upgrade {ended.id} to {ended.to_version} ended {ended.phase}: {ended.error}")
        held = f"{ended.to_version} is held until the jobs file changes or `savepoints apply {ctx.name} --retry`"
        return replace(said, error=UpgradeFailed(f"{ctx.name}: {said.outcome}; {held}"))


def _rescale_ended(ctx: JobContext, record: Reconciled, ended: Upgrade, step: Step) -> Applied:
    """What a rescale came to, on its record: its outcome, and the time it took from its start to its cutover (what
    the next one is expected to cost). One that did not end DONE left the old size running: the step fails, saying
    so; the cooldown and the hourly budget keep the next try apart."""
    started = epoch_of(ended.created_at)
    cut = epoch_of(ended.cutover_at) - started if ended.cutover_at else None
    for i in range(len(record.rescales) - 1, -1, -1):
        rescale = record.rescales[i]
        if rescale.upgrade in (None, ended.id) and rescale.at <= started + 1 and rescale.to_size == ended.size:
            record.rescales[i] = replace(rescale, upgrade=ended.id, outcome=str(ended.phase), seconds=cut)
            break
    what = f"rescale of {ended.to_version} from {ended.from_size} to {ended.size} (upgrade {ended.id}, {ended.mode})"
    if ended.phase is Phase.DONE:
        return _done(ctx, record, step, f"{what} done")
    said = _done(ctx, record, step, f"{what} ended {ended.phase}: {ended.error}")
    return replace(said, error=UpgradeFailed(f"{ctx.name}: {said.outcome}; it keeps running at {ended.from_size}"))


def _done(ctx: JobContext, record: Reconciled, step: Step, outcome: str) -> Applied:
    record.last_step = f"{utc_now()} {step.action}: {outcome}"
    records.write(ctx.store.storage, record)
    log.info("%s: %s", ctx.name, outcome)
    return Applied(step, outcome)


def _note(ctx: JobContext, step: Step) -> None:
    """A step that acts on nothing: the running desired version is the last stable one; written only when it
    changes, and only under the job's lease (a person's operation holding it: next time)."""
    if step.action is not Action.NOTHING or ctx.spec.desired is None:
        return
    record = records.read(ctx.store.storage, ctx.name)
    running = step.version  # the desired version, running
    if running is None or (record.last_stable_version == running and step.recommendation is None):
        return
    try:
        with operation(ctx, "apply"):
            record = records.read(ctx.store.storage, ctx.name)
            record.last_stable_version = running
            if step.recommendation is not None:
                _judged(record, step.recommendation, ctx.spec.fingerprint)
            records.write(ctx.store.storage, record)
    except SavepointsError as exc:
        log.info("%s: the last stable version and the autoscaler's figures are written next time (%s)", ctx.name, exc)


def _judged(record: Reconciled, recommendation: Recommendation, fingerprint: str) -> None:
    """The autoscaler's recommendation kept for status, the page and the metrics; the last scale-up's check, once
    judged, kept on it (an ineffective one holds scale-ups under this jobs file: decide.py)."""
    record.recommendation = {"at": time.time(), **recommendation.to_dict()}
    if recommendation.effective is not None and record.rescales:
        last = record.rescales[-1]
        record.rescales[-1] = replace(last, effective=recommendation.effective)
        if recommendation.effective is False:
            record.scale_up_held = (
                f"the scale-up from {last.from_size} to {last.to_size} at {utc_stamp(last.at)} did not raise the "
                "processing rate by a tenth of what it should have"
            )
            record.scale_up_held_under = fingerprint


def apply(
    context: Context,
    names: list[str] | None = None,
    *,
    dry_run: bool = False,
    on_job: Callable[[Applied], None] | None = None,
) -> list[Applied]:
    """Every declared job's step (or `names`'), one job after the other; a job whose step fails does not stop the
    others."""
    declared = context.declared_jobs()
    unknown = sorted(set(names or ()) - set(declared))
    if unknown:
        raise NotFound(f"job(s) {', '.join(unknown)} not declared in {context.jobs_path}: declare them there")
    done = []
    for name in names or sorted(declared):
        applied = apply_job(context.job(name), dry_run=dry_run)
        if on_job is not None:
            on_job(applied)
        done.append(applied)
    return done


def declared_status(ctx: JobContext, now: float | None = None) -> dict[str, Any] | None:
    """What a declared job should run against what the loop recorded, for `status` and the page (None: the job
    declares no `desired`)."""
    desired = ctx.spec.desired
    if desired is None:
        return None
    kept = records.read(ctx.store.storage, ctx.name)
    now = time.time() if now is None else now
    policy = ctx.spec.restart
    recent = kept.counted(policy, now)
    return {
        "desired": f"{desired.version} {desired.state}",
        "last_stable_version": kept.last_stable_version,
        "restarts": len(kept.restarts),  # every attempt, one whose deploy failed too: what the budget counts
        "restarts_failed": sum(1 for r in kept.restarts if r.error),
        "restarts_left": max(0, policy.attempts - len(recent)),
        "last_restart": asdict(kept.restarts[-1]) if kept.restarts else None,
        "held_versions": sorted(v for v, under in kept.failed_versions.items() if under == ctx.spec.fingerprint),
        "paused_by": kept.paused_by,
        "last_step": kept.last_step,
        "autoscale": _autoscale_status(ctx, kept),
    }


def _autoscale_status(ctx: JobContext, kept: Reconciled) -> dict[str, Any] | None:
    """The autoscaler's state for status, the page and the metrics (None: the job declares none)."""
    policy = ctx.spec.autoscale
    if policy is None:
        return None
    # the size it runs at: the newest deployment not retired (the green of a blue/green rescale once launched:
    # the size it is going to); None when nothing runs. Its record, not the heartbeat: no more reads than the index
    live = [d for d in ctx.deployments.list(ctx.name) if not d.retired_at]
    return {
        "mode": str(policy.mode),
        "knob": str(policy.knob_for(ctx.spec.spark_master)),
        "size": ctx.spec.size_of(live[-1].master, live[-1].spark_conf) if live else None,
        "min": policy.min,
        "max": policy.max,
        "recommendation": kept.recommendation,
        "last_rescale": asdict(kept.rescales[-1]) if kept.rescales else None,
        "rescales": kept.rescales_total,
        "scale_up_held": held(kept, ctx.spec.fingerprint),
    }


def describe_declared(job: str, declared: dict[str, Any]) -> str:
    """`declared_status` for a person: a line, and the autoscaler's lines below it (scaling.py)."""
    parts = [f"{job}: desired {declared['desired']}"]
    if declared["last_stable_version"]:
        parts.append(f"last stable {declared['last_stable_version']}")
    failed = f" ({declared['restarts_failed']} failed)" if declared.get("restarts_failed") else ""
    parts.append(f"{declared['restarts']} restart(s){failed}, {declared['restarts_left']} left in the window")
    if declared["held_versions"]:
        parts.append(f"held: {', '.join(declared['held_versions'])} (`savepoints apply {job} --retry`)")
    if declared["paused_by"]:
        parts.append(f"paused by {declared['paused_by']} (`savepoints apply {job} --resume`)")
    autoscale = declared.get("autoscale")
    return "\n  ".join(["; ".join(parts), *(describe_autoscale(job, autoscale) if autoscale else ())])


def set_pause(ctx: JobContext, paused: bool) -> Reconciled:
    """A person takes the job over (`apply --pause`: the loop leaves it alone) or gives it back (`--resume`)."""
    with operation(ctx, "apply"):
        record = records.read(ctx.store.storage, ctx.name)
        who = ctx.requested_by or default_holder()
        record.paused_by, record.paused_at = (who, utc_now()) if paused else (None, None)
        records.write(ctx.store.storage, record)
        return record


def retry(ctx: JobContext) -> Reconciled:
    """A person asks the loop to try again what it holds: the versions that failed, and a spent restart budget (the
    restarts stay recorded; the budget counts from now)."""
    with operation(ctx, "apply"):
        record = records.read(ctx.store.storage, ctx.name)
        record.failed_versions.clear()
        record.budget_from = time.time()
        record.scale_up_held = None
        records.write(ctx.store.storage, record)
        return record
