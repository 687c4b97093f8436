"""The steps of an upgrade: one handler per phase (record.py), each looking at the world, deciding the next
phase and acting once, so that any of them can run again after a crash (the Flink operator's blue/green
state handlers). Every step runs under the job's lease, held as `upgrade:<id>` and kept between steps, and
with a request id of its own (`<upgrade>/<phase>`), so that a step retried after its process died adopts
what its first try made: the savepoint, the new deployment, the stop. The CLI (run.py `run_upgrade`), the
upgrade DAG and the Savepoints page drive these same steps.

What a step cannot finish turns into the recovery its moment calls for: before the cutover an ABORT (the old
version never stopped writing: remove the new one and what it staged, un-gate the old one), from the
cutover on a ROLLBACK (the old version back from a savepoint taken before the new one wrote, its sink
rewound). See docs/architecture.md, "Upgrades"."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from ..context import JobContext
from ..errors import BrokerUnavailable, Refused, SavepointsError, StoreUnavailable
from ..jobs.deploy import activate, launch_beside, prestart
from ..jobs.deployments import ControlRequest, Deployment, State
from ..jobs.health import Health, Verdict, assess
from ..jobs.preflight import preflight
from ..jobs.snapshot import snapshot_deployment
from ..jobs.stop import kill, running_deployment, stop, stop_request_id
from ..jobs.upgrade import rollback
from ..lease import LeaseHeld, LeaseLost
from ..sinks import DELTA, from_description
from ..sinks import delta as delta_sink
from ..snapshots.manifest import Kind, Trigger, utc_now
from ..sources import KAFKA, positions
from .migration import run_migration
from .mode import Observed, available_memory, decide
from .record import Mode, Phase, Upgrade, Upgrades
from .replay import DEFAULT_MARGIN_SECONDS, ReplayStart, check_first_batch, observe_replay

log = logging.getLogger(__name__)

HOLDER = "upgrade:"  # the lease holder of every step of an upgrade: upgrade:<id>
LEASE_SECONDS = 1800.0  # the lease outlives a step by this much: the next step (or a resume) takes it back
POLL_SECONDS = 0.5


@dataclass(frozen=True)
class UpgradeSettings:
    """What a user sets (the DAG's form, the CLI's flags); kept in the record."""

    min_batches: int = 3  # healthy after this many batches (green before the cutover, the new version after)
    lag_must_fall: bool = True
    allow_renames: bool = False
    accept_source_gap: bool = False
    catch_up_seconds: float = 600.0  # blue/green: green healthy within this, else the upgrade aborts
    confirm_seconds: float = 300.0  # the new version healthy after the cutover within this, else rollback
    # blue/green: T lies this far (event time) ahead of the old version's watermark. 0: the old version's side is
    # done at once; more keeps it writing until event time passes T, and makes an abort between its gate and the
    # new version's publish clean (it has left nothing to the new one yet)
    margin_seconds: float = 0.0
    answer_seconds: float = 120.0  # a gate or publish request answered within this
    # replay by broker timestamps: a record's Kafka timestamp is assumed at most this much earlier than its event
    # time (replay.py); checked against green's first records
    replay_margin_seconds: float = DEFAULT_MARGIN_SECONDS

    @classmethod
    def of(cls, data: dict[str, Any]) -> UpgradeSettings:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def step_context(ctx: JobContext, upgrade: Upgrade, *, keep: bool = True) -> JobContext:
    """The context a step acts with: the upgrade's lease holder, its own request id."""
    settings = replace(
        ctx.settings,
        holder=HOLDER + upgrade.id,
        keep_lease=keep,
        lease_ttl=LEASE_SECONDS,
        request_id=f"{upgrade.id}/{upgrade.phase}",
        requested_by=ctx.requested_by or f"upgrade {upgrade.id}",
    )
    return replace(ctx, settings=settings)


# -- the handlers: (ctx, upgrade) -> upgrade; a waiting one returns it unchanged


def savepointing(ctx: JobContext, upgrade: Upgrade) -> Upgrade:
    old = running_deployment(ctx, f"nothing to upgrade; deploy it (`savepoints deploy {ctx.name}`)")
    upgrade.old_deployment, upgrade.old_version = old.id, old.version
    taken = snapshot_deployment(ctx, old, kind=Kind.SAVEPOINT, trigger=Trigger.UPGRADE, labels=_labels(upgrade))
    upgrade.savepoint = taken.id
    return upgrade.move(
        Phase.PREFLIGHT, f"live savepoint {taken.id} of {old.id} ({old.version}) at batch {taken.batch_id}"
    )


def preflighting(ctx: JobContext, upgrade: Upgrade) -> Upgrade:
    settings = UpgradeSettings.of(upgrade.settings)
    assert upgrade.savepoint is not None
    report = preflight(
        ctx,
        upgrade.savepoint,
        upgrade.to_version,
        allow_renames=settings.allow_renames,
        accept_source_gap=settings.accept_source_gap,
    )
    upgrade.preflight = report.to_dict()
    if not report.passed and not report.state_incompatible:
        upgrade.error = report.reason
        return upgrade.move(Phase.BLOCKED, f"pre-flight: {report.reason}")
    old = _deployment(ctx, upgrade.old_deployment)
    old_status = ctx.deployments.status(ctx.name, old.id)
    version = ctx.spec.version(upgrade.to_version)
    manifest = ctx.store.get(ctx.name, upgrade.savepoint)
    replay = observe_replay(ctx, manifest, ctx.open(old.checkpoint), report.replay, settings.replay_margin_seconds)
    sources = positions(manifest.offsets_version, manifest.source_offsets)
    seen = Observed(
        old_sink=old_status.sink if old_status else None,
        old_gate=old_status.gate if old_status else None,
        new_sink=report.sink,
        new_gate=report.gate,
        master=ctx.spec.spark_master,
        driver_memory={**ctx.spec.conf, **version.conf}.get("spark.driver.memory"),
        available_memory=available_memory(),
        state_problem=None if report.passed else report.reason,
        replay=None if replay.start else replay.reason,
        replay_reason=replay.reason,
        migrate=version.migrate,
        kafka_only=bool(sources) and all(p.kind == KAFKA for p in sources),
    )
    decision = decide(upgrade.requested_mode, seen)
    upgrade.modes = {str(mode): reason for mode, reason in decision.reasons.items()}
    if decision.mode is None:
        upgrade.error = decision.blocked
        return upgrade.move(Phase.BLOCKED, str(decision.blocked))
    upgrade.mode = str(decision.mode)
    if decision.mode is Mode.REPLAY:
        assert replay.start is not None
        upgrade.replay = replay.start.to_dict()
    passed = "pre-flight passed" if report.passed else "the state cannot be taken over"
    note = f"{passed}; mode {decision.mode}: {decision.reasons[decision.mode]}"
    return upgrade.move(Phase.MIGRATING if decision.mode is Mode.MIGRATE else Phase.LAUNCHING, note)


def migrating(ctx: JobContext, upgrade: Upgrade) -> Upgrade:
    """The version's migration function makes green's initial state from the savepoint's, checked on a throwaway
    run (migration.py); a failure blocks the upgrade before anything was started."""
    assert upgrade.savepoint is not None
    version = ctx.spec.version(upgrade.to_version)
    manifest = ctx.store.get(ctx.name, upgrade.savepoint)
    report = run_migration(ctx, manifest, version.name, str(version.migrate), initial_state_location(ctx, upgrade))
    upgrade.migration = report.to_dict()
    if not report.passed:
        _remove_scratch(ctx, upgrade)
        upgrade.error = report.reason
        return upgrade.move(Phase.BLOCKED, report.reason)
    return upgrade.move(Phase.LAUNCHING, report.reason)


def launching(ctx: JobContext, upgrade: Upgrade) -> Upgrade:
    settings = UpgradeSettings.of(upgrade.settings)
    assert upgrade.savepoint is not None
    if upgrade.mode == Mode.STOP_RESTORE:
        standby = prestart(ctx, upgrade.to_version, prerestore=upgrade.savepoint)
        upgrade.new_deployment = standby.id
        return upgrade.move(Phase.CUTTING_OVER, f"pre-started {standby.id} in STANDBY, the savepoint restored into it")
    upgrade.staging = upgrade.staging or staging_location(ctx, upgrade)
    if upgrade.mode == Mode.REPLAY:
        start = ReplayStart.of(upgrade.replay or {})
        green = launch_beside(ctx, upgrade.to_version, upgrade.savepoint, upgrade.staging, fresh=True, seed=start.seed)
        began = f"with empty state, {start.note}" + (f" ({start.records} records)" if start.records is not None else "")
    elif upgrade.mode == Mode.MIGRATE:
        migration = upgrade.migration or {}
        seed, initial = migration.get("seed"), migration.get("initial_state")
        green = launch_beside(
            ctx, upgrade.to_version, upgrade.savepoint, upgrade.staging, fresh=True, seed=seed, initial_state=initial
        )
        began = f"at {upgrade.savepoint}'s positions with the migrated state {initial}"
    else:
        green = launch_beside(ctx, upgrade.to_version, upgrade.savepoint, upgrade.staging)
        began = f"from {upgrade.savepoint}"
    upgrade.new_deployment = green.id
    upgrade.deadline = time.time() + settings.catch_up_seconds
    return upgrade.move(Phase.CATCHING_UP, f"green {green.id} started {began}, staging into {upgrade.staging}")


def catching_up(ctx: JobContext, upgrade: Upgrade) -> Upgrade:
    settings = UpgradeSettings.of(upgrade.settings)
    old = _deployment(ctx, upgrade.old_deployment)
    if (state := ctx.state_of(old)) is not State.RUNNING:
        return _abort(upgrade, f"the old deployment {old.id} is {state}")
    health = new_health(ctx, upgrade, settings)
    new = _deployment(ctx, upgrade.new_deployment)
    if upgrade.mode == Mode.REPLAY and upgrade.replay:
        status = ctx.deployments.status(ctx.name, new.id)
        first = _millis(status.first_event_time if status else None)
        if (problem := check_first_batch(ReplayStart.of(upgrade.replay), first)) is not None:
            return _abort(upgrade, problem)
    behind = _behind(ctx, old, new)
    if health.verdict is Verdict.HEALTHY and behind is None:
        return upgrade.move(Phase.CUTTING_OVER, f"green healthy: {health.reason}; its event time caught up")
    if health.verdict is Verdict.UNHEALTHY:
        return _abort(upgrade, f"green is unhealthy: {health.reason}")
    if upgrade.deadline is not None and time.time() > upgrade.deadline:
        why = behind if health.verdict is Verdict.HEALTHY else health.reason
        return _abort(upgrade, f"green did not catch up within {settings.catch_up_seconds:.0f} s: {why}")
    return upgrade


def _behind(ctx: JobContext, old: Deployment, new: Deployment) -> str | None:
    """Why green is not caught up yet in event time: its watermark behind the old version's (the windows after T
    would then reach the table later than the old version would have written them). None when it is not."""
    statuses = [ctx.deployments.status(ctx.name, d.id) for d in (old, new)]
    blue, green = (_millis(status.watermark if status else None) for status in statuses)
    if blue is None or green is None or green >= blue:
        return None
    return f"green's watermark {iso_millis(green)} is behind the old version's {iso_millis(blue)}"


def cutting_over(ctx: JobContext, upgrade: Upgrade) -> Upgrade:
    settings = UpgradeSettings.of(upgrade.settings)
    old = _deployment(ctx, upgrade.old_deployment)
    if upgrade.mode == Mode.STOP_RESTORE:
        if upgrade.stop_savepoint is None:
            result = stop(ctx, savepoint=True, deployment_id=old.id, labels=_labels(upgrade))
            assert result.snapshot is not None  # savepoint=True takes one or raises
            upgrade.stop_savepoint = upgrade.rollback_savepoint = result.snapshot.id
            _save(ctx, upgrade)
        new_id = str(upgrade.new_deployment)
        activate(
            ctx,
            new_id,
            upgrade.stop_savepoint,
            wait_seconds=0,
            rewind_sink=True,
            accept_source_gap=settings.accept_source_gap,
        )
        upgrade.cutover_at = utc_now()
        upgrade.deadline = time.time() + settings.confirm_seconds
        note = f"{old.id} stopped with savepoint {upgrade.stop_savepoint}; {new_id} started from it"
        return upgrade.move(Phase.CONFIRMING, note)
    _gate_and_publish(ctx, upgrade, old, settings)
    if not upgrade.cut_over:  # declined: aborting
        return upgrade
    t = iso_millis(upgrade.cutover_ms)
    return upgrade.move(Phase.RETIRING, f"cut over at {t}: windows ending after it come from {upgrade.new_deployment}")


def retiring(ctx: JobContext, upgrade: Upgrade) -> Upgrade:
    """Blue/green after the cutover: the old deployment writes its last windows (those ending up to T) once its
    watermark passes T, then stops with a savepoint. Without new input its watermark stands still: it waits."""
    settings = UpgradeSettings.of(upgrade.settings)
    old = _deployment(ctx, upgrade.old_deployment)
    if upgrade.stop_savepoint is None:
        state, status = ctx.state_of(old), ctx.deployments.status(ctx.name, old.id)
        stopping = state in (State.STOPPING, State.STOPPED) and _asked_to_stop(ctx, old)  # by an earlier try
        if state is not State.RUNNING and not stopping:
            upgrade.error = f"the old deployment {old.id} is {state} before it wrote every window up to the cutover"
            return upgrade.move(Phase.ROLLING_BACK, upgrade.error)
        watermark = _millis(status.watermark if status else None)
        if not stopping and (watermark is None or watermark < int(upgrade.cutover_ms or 0)):
            return upgrade
        result = stop(ctx, savepoint=True, deployment_id=old.id, labels=_labels(upgrade))  # adopts an earlier try's
        upgrade.stop_savepoint = result.snapshot.id if result.snapshot else None
    upgrade.deadline = time.time() + settings.confirm_seconds
    note = f"the old deployment {old.id} wrote its last window and stopped with savepoint {upgrade.stop_savepoint}"
    return upgrade.move(Phase.CONFIRMING, note)


def confirming(ctx: JobContext, upgrade: Upgrade) -> Upgrade:
    settings = UpgradeSettings.of(upgrade.settings)
    health = new_health(ctx, upgrade, settings)
    if health.verdict is Verdict.HEALTHY:
        _remove_scratch(ctx, upgrade)
        return upgrade.move(Phase.DONE, f"{upgrade.to_version} healthy after the cutover: {health.reason}")
    if health.verdict is Verdict.UNHEALTHY:
        upgrade.error = health.reason
        return upgrade.move(Phase.ROLLING_BACK, f"unhealthy after the cutover: {health.reason}")
    if upgrade.deadline is not None and time.time() > upgrade.deadline:
        upgrade.error = f"not healthy within {settings.confirm_seconds:.0f} s after the cutover: {health.reason}"
        return upgrade.move(Phase.ROLLING_BACK, upgrade.error)
    return upgrade


def aborting(ctx: JobContext, upgrade: Upgrade) -> Upgrade:
    """Before the cutover: the new deployment stopped (or killed) and its checkpoint and staging removed; the
    old one un-gated if it was gated. If the old one already left rows to the new one, a plain abort would
    lose them: roll back instead."""
    if upgrade.old_deployment and upgrade.cutover_ms is not None:
        answer = _ask(ctx, upgrade, _deployment(ctx, upgrade.old_deployment), "ungate", {})
        if answer is not None and answer != "accepted":
            upgrade.rollback_savepoint = upgrade.savepoint
            return upgrade.move(Phase.ROLLING_BACK, f"the old deployment cannot go on alone: {answer}")
    if upgrade.new_deployment:
        new = _deployment(ctx, upgrade.new_deployment)
        _retire(ctx, new)
        location = ctx.open(new.checkpoint)
        location.delete([info.key for info in location.list()])
    _remove_scratch(ctx, upgrade)
    return upgrade.move(Phase.ABORTED, "the new version and what it staged removed; the old version runs on untouched")


def rolling_back(ctx: JobContext, upgrade: Upgrade) -> Upgrade:
    """From the cutover on: every deployment of the upgrade stopped, then the old version back from the
    savepoint taken before the new version wrote (blue/green: the live savepoint green started from; stop/restore:
    the stop-with-savepoint), its sink rewound to it (Delta's RESTORE and a new query id)."""
    for deployment_id in (upgrade.new_deployment, upgrade.old_deployment):
        if deployment_id:
            _retire(ctx, _deployment(ctx, deployment_id))
    target = upgrade.rollback_savepoint or upgrade.savepoint
    result = rollback(ctx, target)
    _remove_scratch(ctx, upgrade)
    return upgrade.move(Phase.ROLLED_BACK, f"{result.reason}")


HANDLERS: dict[Phase, Callable[[JobContext, Upgrade], Upgrade]] = {
    Phase.SAVEPOINTING: savepointing,
    Phase.PREFLIGHT: preflighting,
    Phase.MIGRATING: migrating,
    Phase.LAUNCHING: launching,
    Phase.CATCHING_UP: catching_up,
    Phase.CUTTING_OVER: cutting_over,
    Phase.RETIRING: retiring,
    Phase.CONFIRMING: confirming,
    Phase.ABORTING: aborting,
    Phase.ROLLING_BACK: rolling_back,
}


def advance(ctx: JobContext, upgrade: Upgrade) -> Upgrade:
    """Run the current phase's step once, under the upgrade's lease (released when the upgrade ends), and
    store the record. A step that fails before the cutover turns into an abort, from it into a rollback;
    an unreachable store leaves the phase as it was (resume later)."""
    if upgrade.phase.terminal:
        return upgrade
    step_ctx = step_context(ctx, upgrade)
    handler = HANDLERS[upgrade.phase]
    with step_ctx.operation("upgrade"):
        try:
            upgrade = handler(step_ctx, upgrade)
        except (StoreUnavailable, BrokerUnavailable, LeaseHeld, LeaseLost):
            raise  # transient, or someone else acts on the job: the phase stays, to be resumed
        except SavepointsError as exc:
            upgrade = _recover(upgrade, exc)
        _save(step_ctx, upgrade)
    if upgrade.phase.terminal:
        _release(ctx, upgrade)
    return upgrade


# -- helpers


def new_health(ctx: JobContext, upgrade: Upgrade, settings: UpgradeSettings) -> Health:
    """The new deployment's health: `min_batches` batches past its start (green: past its publish, once it
    published), a Kafka lag that falls where asked, no error."""
    new = _deployment(ctx, upgrade.new_deployment)
    status = ctx.deployments.status(ctx.name, new.id)
    published = ((status.gate if status else None) or {}).get("published_batch")
    judged = replace(new, restored_batch_id=published) if published is not None else new
    if upgrade.mode and Mode(upgrade.mode).beside and upgrade.cut_over and published is None:  # from its publish
        judged = replace(new, restored_batch_id=(status.last_batch_id if status else None) or 0)
    return assess(
        judged,
        status,
        min_batches=settings.min_batches,
        heartbeat_timeout=ctx.spec.heartbeat_timeout,
        lag_must_fall=settings.lag_must_fall,
    )


def staging_location(ctx: JobContext, upgrade: Upgrade) -> str:
    """Green's staging table: beside the job's checkpoints, never inside the live table."""
    return f"{ctx.spec.checkpoint_root.rstrip('/')}/{ctx.name}/_staging/{upgrade.id}"


def initial_state_location(ctx: JobContext, upgrade: Upgrade) -> str:
    """A migration's initial state (Parquet), kept until the upgrade ends: green reads it whenever it starts."""
    return f"{ctx.spec.checkpoint_root.rstrip('/')}/{ctx.name}/_initial_state/{upgrade.id}"


def floor_of(upgrade: Upgrade) -> int:
    """The earliest T the old version may choose: for a green that did not start from its state, the savepoint's
    watermark, from which on green holds every window (replay.py); 0 otherwise."""
    if upgrade.mode == Mode.REPLAY and upgrade.replay:
        return int(upgrade.replay.get("floor_ms") or 0)
    if upgrade.mode == Mode.MIGRATE and upgrade.migration:
        return int((upgrade.migration.get("seed") or {}).get("watermark_ms") or 0)
    return 0


def _gate_and_publish(ctx: JobContext, upgrade: Upgrade, old: Deployment, settings: UpgradeSettings) -> None:
    """The gate at the old deployment, which chooses T at its next batch (the latest window end it wrote, plus
    the margin) and writes nothing after T from then on; then the new one's publish of T: the cutover."""
    new = _deployment(ctx, upgrade.new_deployment)
    if upgrade.cutover_ms is None:
        values = {"margin": int(settings.margin_seconds * 1000), "floor": floor_of(upgrade)}
        answer = _ask(ctx, upgrade, old, "gate", values)
        if answer != "accepted":
            _abort(upgrade, f"the old deployment did not take the gate: {answer or 'it is no longer running'}")
            return
        status = ctx.deployments.status(ctx.name, old.id)
        upgrade.cutover_ms = int(((status.gate if status else None) or {})["until"])
        _save(ctx, upgrade)
    answer = _ask(ctx, upgrade, new, "publish", {"t": upgrade.cutover_ms})
    if answer is None and _wrote_live(ctx, new):  # it died publishing, after its commit got in: past the cutover
        upgrade.rollback_savepoint = upgrade.savepoint
        upgrade.cutover_at = utc_now()
        upgrade.error = f"the new deployment {new.id} failed while it published"
        upgrade.move(Phase.ROLLING_BACK, upgrade.error)
        return
    if answer != "accepted":
        _abort(upgrade, f"the new deployment did not publish: {answer or 'it is no longer running'}")
        return
    upgrade.cutover_at = utc_now()
    upgrade.rollback_savepoint = upgrade.savepoint  # taken before the new version wrote anything to the table
    _save(ctx, upgrade)
    log.info("upgrade %s: cut over at %s", upgrade.id, iso_millis(upgrade.cutover_ms))


def _ask(ctx: JobContext, upgrade: Upgrade, deployment: Deployment, action: str, values: dict[str, int]) -> str | None:
    """Send a gate request (once: its id is the upgrade's and the action's) and wait for its answer; None when
    the deployment is no longer running."""
    request_id = f"rq-{action}-{upgrade.id}"
    status = ctx.deployments.status(ctx.name, deployment.id)
    answered = status is not None and request_id in status.answers
    if not answered and not any(r.id == request_id for r in ctx.deployments.requests(ctx.name, deployment.id)):
        request = ControlRequest(id=request_id, action=action, gate=values, requested_by=f"upgrade {upgrade.id}")
        ctx.deployments.request(ctx.name, deployment.id, request)
    limit = UpgradeSettings.of(upgrade.settings).answer_seconds
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        status = ctx.deployments.status(ctx.name, deployment.id)
        if status is not None and request_id in status.answers:
            return status.answers[request_id]
        if not ctx.state_of(deployment).live:
            return None
        time.sleep(POLL_SECONDS)
    raise SavepointsError(
        f"deployment {deployment.id} did not answer the {action} request {request_id} within {limit:.0f} s (it "
        "decides at its next batch: is input arriving?)"
    )


def _asked_to_stop(ctx: JobContext, deployment: Deployment) -> bool:
    """Whether this step's stop request (its id derives from the step's request id: jobs/stop.py) reached the
    deployment: an earlier try of the step that died after asking."""
    request_id = stop_request_id(ctx)
    status = ctx.deployments.status(ctx.name, deployment.id)
    handled = status is not None and request_id in status.handled_requests
    return handled or any(r.id == request_id for r in ctx.deployments.requests(ctx.name, deployment.id))


def _wrote_live(ctx: JobContext, deployment: Deployment) -> bool:
    """Whether a (green) deployment has any batch in the live Delta table (its query id's txn)."""
    status = ctx.deployments.status(ctx.name, deployment.id)
    sink = from_description(status.sink if status else None)
    if sink is None or sink.kind != DELTA or not status or not status.query_id:
        return False
    return delta_sink.last_batch(ctx.open(sink.location), status.query_id) is not None


def _labels(upgrade: Upgrade) -> dict[str, str]:
    return {"upgrade_to": upgrade.to_version, "upgrade": upgrade.id}


def iso_millis(millis: int | None) -> str:
    return "-" if millis is None else datetime.fromtimestamp(millis / 1000, UTC).isoformat().replace("+00:00", "Z")


def _abort(upgrade: Upgrade, why: str) -> Upgrade:
    upgrade.error = why
    return upgrade.move(Phase.ABORTING, why)


def _recover(upgrade: Upgrade, exc: Exception) -> Upgrade:
    """A step failed: abort before the cutover, roll back from it, and a failed recovery is FAILED."""
    why = f"{upgrade.phase} failed: {exc}"
    log.error("upgrade %s: %s", upgrade.id, why)
    if upgrade.phase in (Phase.ABORTING, Phase.ROLLING_BACK):
        upgrade.error = why
        return upgrade.move(Phase.FAILED, why)
    if not upgrade.cut_over:
        if upgrade.phase in (Phase.SAVEPOINTING, Phase.PREFLIGHT):  # nothing was started
            upgrade.error = why
            return upgrade.move(Phase.BLOCKED, why)
        return _abort(upgrade, why)
    upgrade.error = why
    return upgrade.move(Phase.ROLLING_BACK, why)


def _retire(ctx: JobContext, deployment: Deployment) -> None:
    """Stop a deployment that is live (kill it if it will not stop); nothing for one that ended."""
    state = ctx.state_of(deployment)
    if state.live:
        try:
            stop(ctx, deployment_id=deployment.id)
            return
        except SavepointsError as exc:
            log.warning("stopping %s failed (%s); killing it", deployment.id, exc)
    if state.live or state is State.LOST:
        with contextlib.suppress(Refused):
            kill(ctx, deployment.id)


def _remove_scratch(ctx: JobContext, upgrade: Upgrade) -> None:
    """What the upgrade made beside the job's checkpoints: green's staging table, a migration's initial state."""
    initial = (upgrade.migration or {}).get("initial_state")
    for location in (upgrade.staging, initial):
        if location:
            scratch = ctx.open(location)
            scratch.delete([info.key for info in scratch.list()])


def _deployment(ctx: JobContext, deployment_id: str | None) -> Deployment:
    if not deployment_id:
        raise SavepointsError("the upgrade record names no deployment for this step")
    return ctx.deployments.get(ctx.name, deployment_id)


def _millis(stamp: str | None) -> int | None:
    if not stamp:
        return None
    return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)


def _save(ctx: JobContext, upgrade: Upgrade) -> None:
    upgrade.updated_at = utc_now()
    Upgrades(ctx.store.storage).put(upgrade)


def _release(ctx: JobContext, upgrade: Upgrade) -> None:
    """The upgrade ended: its lease goes (taken and released by the same holder)."""
    with step_context(ctx, upgrade, keep=False).operation("upgrade"):
        pass
