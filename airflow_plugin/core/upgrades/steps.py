"""The steps of an upgrade: one handler per phase (record.py), each looking at the world, deciding the next
phase and acting once, so that any of them can run again after a crash (the Flink operator's blue/green
state handlers). Every step runs under the job's lease, held as `upgrade:<id>@<driver>` and kept between steps, and
with a request id of its own (`<upgrade>/<phase>`), so that a step retried after its process died adopts
what its first try made: the savepoint, the new deployment, the stop. The CLI (run.py `run_upgrade`), the
upgrade DAG and the Savepoints page drive these same steps.

One process drives an upgrade: its driver (an Airflow DAG run, else the process: `upgrade_holder`) is part of the
lease's holder, so the run's next task, a retried or resumed task and the same process go on at once, and anyone
else only once that lease expired or its process is seen gone (core/lease.py). A step then first checks that the
record is still the one it read (record.py `Upgrades.check`), and writes it by compare-and-swap.

What a step cannot finish turns into the recovery its moment calls for: before the cutover an ABORT (the old
version never stopped writing: fence the new one's publish, then un-gate the old one, then remove the new one
and what it staged: never two writers of a window at any instant), from the cutover on a ROLLBACK (the old
version back from a savepoint taken before the new one wrote, its sink rewound). A recovery that cannot finish
is FAILED and says which deployment writes which windows (`writers`). See docs/architecture.md, "Upgrades"."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from ..errors import BrokerUnavailable, NotReady, Refused, SavepointsError, StoreUnavailable
from ..jobs.context import JobContext
from ..jobs.fence import KILLED
from ..jobs.fresh_start import build_of, code_digest
from ..jobs.health import Health, Verdict, assess
from ..jobs.launcher import driver_ended
from ..jobs.observe import observe_deployment, state_of
from ..jobs.operation import operation
from ..jobs.snapshot import snapshot_deployment
from ..jobs.stop import kill, running_deployment, stop, stop_request_id
from ..lease import LeaseHeld, LeaseLost, default_holder
from ..records.deployment import BLUE, GREEN, STAGING, ControlRequest, Deployment, DeploymentStatus, State
from ..records.manifest import Kind, Trigger
from ..sinks import DELTA
from ..sinks import delta as delta_sink
from ..sources import KAFKA, positions
from ..timestamps import utc_now
from .launch import activate, launch_beside, prestart
from .migration import run_migration
from .mode import Observed, available_memory, decide
from .preflight import preflight
from .record import Mode, Phase, Upgrade, UpgradeMovedOn, Upgrades
from .replay import DEFAULT_MARGIN_SECONDS, ReplayStart, check_first_batch, observe_replay
from .rollback import rollback

log = logging.getLogger(__name__)

HOLDER = "upgrade:"  # the lease holder of every step of an upgrade: upgrade:<id>@<driver> (upgrade_holder)
LEASE_SECONDS = 1800.0  # the lease outlives a step by this much: the next step takes it back, anyone else after it
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
    # stop/restore: the new version's driver ready in STANDBY (its session up and warm) within this, else the upgrade
    # aborts before the old version is stopped (a busy cluster may take minutes to give it a container)
    start_seconds: float = 600.0
    # blue/green: T lies this far (event time) ahead of the old version's watermark. 0: the old version's side is
    # done at once; more keeps it writing until event time passes T, and makes an abort between its gate and the
    # new version's publish clean (it has left nothing to the new one yet)
    margin_seconds: float = 0.0
    answer_seconds: float = 120.0  # a gate or publish request answered within this
    # replay by broker timestamps: a record's Kafka timestamp is assumed at most this much earlier than its event
    # time (replay.py); checked against green's first records
    replay_margin_seconds: float = DEFAULT_MARGIN_SECONDS
    # how long the job's lease outlives a step (an approval's wait: the approval timeout and this): a driver that
    # stops coming back (its task killed on another host) leaves the upgrade to others only after it
    lease_seconds: float = LEASE_SECONDS

    @classmethod
    def of(cls, data: dict[str, Any]) -> UpgradeSettings:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def upgrade_holder(upgrade_id: str, driver: str | None = None) -> str:
    """The lease holder of an upgrade's steps, `upgrade:<id>@<driver>`: the upgrade, and who drives it, an Airflow DAG
    run (`airflow:<dag>/<run>`: its tasks, a retry, a task resumed after its trigger go on) or else this process
    (`user@host:<process>`, lease.py `default_holder`: a process seen gone leaves it at once)."""
    driver = driver or default_holder()
    if driver.startswith(f"{HOLDER}{upgrade_id}@"):  # a step's own context already
        return driver
    return f"{HOLDER}{upgrade_id}@{driver}"


def step_request_id(upgrade: Upgrade, phase: Phase) -> str:
    """The request id a step of `phase` acts under: what it launches is recorded with it (Deployment.request_id),
    so that a retry takes it over and a recovery finds it even where the step died before naming it."""
    return f"{upgrade.id}/{phase}"


def step_context(ctx: JobContext, upgrade: Upgrade, *, keep: bool = True, wait: float = 0.0) -> JobContext:
    """The context a step acts with: the upgrade's lease holder (its driver's), its lease kept for `wait` seconds
    and the upgrade's `lease_seconds` more, its own request id."""
    settings = replace(
        ctx.settings,
        holder=upgrade_holder(upgrade.id, ctx.settings.holder),
        keep_lease=keep,
        lease_ttl=wait + UpgradeSettings.of(upgrade.settings).lease_seconds,
        request_id=step_request_id(upgrade, upgrade.phase),
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
    ctx = sized(ctx, upgrade, new=True)  # the new deployment's master decides what may run beside the old one
    settings = UpgradeSettings.of(upgrade.settings)
    assert upgrade.savepoint is not None
    old = _deployment(ctx, upgrade.old_deployment)
    old_status = ctx.deployments.status(ctx.name, old.id)
    version = ctx.spec.version(upgrade.to_version)
    # a rescale of the build the old deployment runs, its code file byte for byte the one it launched: that code
    # already runs on this state (preflight.py); a file edited in place since is checked like any new code
    digest = old.code_digest
    same_build = (
        upgrade.size is not None
        and old.version == version.name
        and old.build == build_of(ctx, version)
        and digest is not None
        and digest == code_digest(version)
    )
    report = preflight(
        ctx,
        upgrade.savepoint,
        upgrade.to_version,
        allow_renames=settings.allow_renames,
        accept_source_gap=settings.accept_source_gap,
        running=old_status if same_build and old_status is not None else None,
    )
    upgrade.preflight = report.to_dict()
    if not report.passed and not report.state_incompatible:
        upgrade.error = report.reason
        return upgrade.move(Phase.BLOCKED, f"pre-flight: {report.reason}")
    manifest = ctx.store.get(ctx.name, upgrade.savepoint)
    shapes = (old_status.query_shape if old_status else None, report.query_shape)
    replay = observe_replay(
        ctx, manifest, ctx.open(old.checkpoint), report.replay, settings.replay_margin_seconds, shapes
    )
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
        old_shape=old_status.query_shape if old_status else None,
        new_shape=report.query_shape,
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
    ctx = sized(ctx, upgrade, new=True)
    settings = UpgradeSettings.of(upgrade.settings)
    assert upgrade.savepoint is not None
    if upgrade.mode == Mode.STOP_RESTORE:
        try:  # the old version is stopped only for a driver that is ready to take over at once
            standby = prestart(
                ctx,
                upgrade.to_version,
                prerestore=upgrade.savepoint,
                upgrade=upgrade.id,
                wait_seconds=settings.start_seconds,
            )
        except NotReady as exc:
            upgrade.new_deployment = exc.deployment_id  # the abort stops it
            return _abort(upgrade, str(exc))
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
        green = launch_beside(
            ctx, upgrade.to_version, upgrade.savepoint, upgrade.staging, partitions=upgrade.partitions
        )
        began = f"from {upgrade.savepoint}"
    upgrade.new_deployment = green.id
    upgrade.deadline = time.time() + settings.catch_up_seconds
    return upgrade.move(Phase.CATCHING_UP, f"green {green.id} started {began}, staging into {upgrade.staging}")


Look = tuple[Phase | None, str]  # a waiting step's look at the world: the phase to move to (None: wait on), and why


def catching_up(ctx: JobContext, upgrade: Upgrade) -> Upgrade:
    phase, why = _look_catching_up(ctx, upgrade)
    if phase is Phase.ABORTING:
        return _abort(upgrade, why)
    return upgrade if phase is None else upgrade.move(phase, why)


def _look_catching_up(ctx: JobContext, upgrade: Upgrade) -> Look:
    settings = UpgradeSettings.of(upgrade.settings)
    old = _deployment(ctx, upgrade.old_deployment)
    if (state := state_of(ctx, old)) is not State.RUNNING:
        return Phase.ABORTING, f"the old deployment {old.id} is {state}"
    health = new_health(ctx, upgrade, settings)
    new = _deployment(ctx, upgrade.new_deployment)
    if upgrade.mode == Mode.REPLAY and upgrade.replay:
        status = ctx.deployments.status(ctx.name, new.id)
        if problem := check_first_batch(ReplayStart.of(upgrade.replay), status.first_rows if status else None):
            return Phase.ABORTING, problem
    behind = _behind(ctx, old, new)
    if health.verdict is Verdict.HEALTHY and behind is None:
        return Phase.CUTTING_OVER, f"green healthy: {health.reason}; its event time caught up"
    if health.verdict is Verdict.UNHEALTHY:
        return Phase.ABORTING, f"green is unhealthy: {health.reason}"
    why = behind if health.verdict is Verdict.HEALTHY else health.reason
    if upgrade.deadline is not None and time.time() > upgrade.deadline:
        return Phase.ABORTING, f"green did not catch up within {settings.catch_up_seconds:.0f} s: {why}"
    return None, f"green catching up: {why}"


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
            partitions=upgrade.partitions,
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
        phase, why = _look_retiring(ctx, upgrade)
        if phase is Phase.ROLLING_BACK:
            upgrade.error = why
            return upgrade.move(phase, why)
        if phase is None:
            return upgrade
        result = stop(ctx, savepoint=True, deployment_id=old.id, labels=_labels(upgrade))  # adopts an earlier try's
        upgrade.stop_savepoint = result.snapshot.id if result.snapshot else None
    upgrade.deadline = time.time() + settings.confirm_seconds
    note = f"the old deployment {old.id} wrote its last window and stopped with savepoint {upgrade.stop_savepoint}"
    return upgrade.move(Phase.CONFIRMING, note)


def _look_retiring(ctx: JobContext, upgrade: Upgrade) -> Look:
    """Whether the old deployment may stop now (its watermark passed T, or an earlier try asked it to stop)."""
    old = _deployment(ctx, upgrade.old_deployment)
    if upgrade.stop_savepoint is not None:
        return Phase.CONFIRMING, "stopped"
    state, status = state_of(ctx, old), ctx.deployments.status(ctx.name, old.id)
    stopping = state in (State.STOPPING, State.STOPPED) and _asked_to_stop(ctx, old)  # by an earlier try
    if state is not State.RUNNING and not stopping:
        return (
            Phase.ROLLING_BACK,
            f"the old deployment {old.id} is {state} before it wrote every window up to the cutover",
        )
    watermark = _millis(status.watermark if status else None)
    if not stopping and (watermark is None or watermark < int(upgrade.cutover_ms or 0)):
        return (
            None,
            f"the old deployment's watermark {iso_millis(watermark)} is before T {iso_millis(upgrade.cutover_ms)}",
        )
    return Phase.CONFIRMING, "its watermark passed T"


def confirming(ctx: JobContext, upgrade: Upgrade) -> Upgrade:
    phase, why = _look_confirming(ctx, upgrade)
    if phase is Phase.DONE:
        _remove_scratch(ctx, upgrade)
    elif phase is Phase.ROLLING_BACK:
        upgrade.error = why
    return upgrade if phase is None else upgrade.move(phase, why)


def _look_confirming(ctx: JobContext, upgrade: Upgrade) -> Look:
    settings = UpgradeSettings.of(upgrade.settings)
    health = new_health(ctx, upgrade, settings)
    if health.verdict is Verdict.HEALTHY:
        return Phase.DONE, f"{upgrade.to_version} healthy after the cutover: {health.reason}"
    if health.verdict is Verdict.UNHEALTHY:
        return Phase.ROLLING_BACK, f"unhealthy after the cutover: {health.reason}"
    if upgrade.deadline is not None and time.time() > upgrade.deadline:
        return (
            Phase.ROLLING_BACK,
            f"not healthy within {settings.confirm_seconds:.0f} s after the cutover: {health.reason}",
        )
    return None, f"the health gate after the cutover: {health.reason}"


LOOKS: dict[Phase, Callable[[JobContext, Upgrade], Look]] = {
    Phase.CATCHING_UP: _look_catching_up,
    Phase.RETIRING: _look_retiring,
    Phase.CONFIRMING: _look_confirming,
}


def waiting(ctx: JobContext, upgrade: Upgrade) -> str | None:
    """Why the upgrade's current step would change nothing if advanced now (it waits for the world: green catching
    up, the old version's watermark, the health gate), or None when advancing it makes progress. A look only, no
    action: what a deferred task's trigger asks (airflow_plugin/triggers/upgrade.py)."""
    look = LOOKS.get(upgrade.phase)
    if look is None or upgrade.phase.terminal:
        return None
    phase, why = look(ctx, upgrade)
    return why if phase is None else None


def aborting(ctx: JobContext, upgrade: Upgrade) -> Upgrade:
    """Before the cutover, in an order that never lets two versions write one window: first the new version can no
    longer publish (its publish withdrawn, or its driver known to have ended) and the live table holds nothing of it;
    then the old version writes every window again (its gate withdrawn whether or not it ever took it, which its
    driver confirms); only then is the new version removed. A new version that did publish turns the abort into a
    rollback, and so does an old version that already left rows to it; an old version that cannot confirm (its
    driver paused or unreachable) keeps the abort waiting, then FAILED, saying which version writes which windows."""
    settings = UpgradeSettings.of(upgrade.settings)
    beside = bool(upgrade.mode) and Mode(str(upgrade.mode)).beside
    new = _deployment(ctx, upgrade.new_deployment) if upgrade.new_deployment else None
    old = _deployment(ctx, upgrade.old_deployment) if upgrade.old_deployment else None
    note = "the old version runs on untouched"
    if beside and new is not None:
        fenced = _fence(ctx, upgrade, new, settings)
        if fenced is UNCONFIRMED:
            return _wait_or_fail(ctx, upgrade, settings, f"the new deployment {new.id} neither answers nor has ended")
        if fenced is not None:
            upgrade.rollback_savepoint = upgrade.savepoint
            upgrade.cutover_at = upgrade.cutover_at or utc_now()
            return upgrade.move(Phase.ROLLING_BACK, f"the new deployment {new.id} had published ({fenced}): rollback")
    if beside and old is not None:
        left = _withdraw_gate(ctx, upgrade, old, settings)
        if left is UNCONFIRMED:
            return _wait_or_fail(ctx, upgrade, settings, f"the old deployment {old.id} has not confirmed its ungate")
        if left is not None and left.startswith("declined"):
            upgrade.rollback_savepoint = upgrade.savepoint
            return upgrade.move(Phase.ROLLING_BACK, f"the old deployment cannot go on alone: {left}")
        note = left or note
    for launched in ([new] if new is not None else []) + _unnamed_launches(ctx, upgrade):
        _remove_launched(ctx, upgrade, launched)
    _remove_scratch(ctx, upgrade)
    return upgrade.move(Phase.ABORTED, f"the new version and what it staged removed; {note}")


def _unnamed_launches(ctx: JobContext, upgrade: Upgrade) -> list[Deployment]:
    """What the upgrade's launch step launched that its record does not name: a step killed before it saved the
    id, one whose driver failed while starting, or a driver an earlier try launched that a retry did not take over
    (a YARN application still queued). None of them was ever asked to start or publish: none holds the job's state."""
    step = step_request_id(upgrade, Phase.LAUNCHING)
    named = (upgrade.new_deployment, upgrade.old_deployment)
    return [d for d in ctx.deployments.list(ctx.name) if d.request_id == step and d.id not in named]


def _remove_launched(ctx: JobContext, upgrade: Upgrade, deployment: Deployment) -> None:
    """A new deployment the recovery gives up: stopped (else killed), retired and marked aborted by the upgrade
    before its location is emptied (the job's state is the old deployment's). Done again, it changes nothing."""
    _retire(ctx, deployment)
    deployment = ctx.deployments.get(ctx.name, deployment.id)  # as _retire left it
    deployment.aborted_by = upgrade.id
    deployment.retired_at = deployment.retired_at or utc_now()  # one that had failed already: retention's to reclaim
    ctx.deployments.put(deployment)
    location = ctx.open(deployment.checkpoint)
    location.delete([info.key for info in location.list()])


UNCONFIRMED = "unconfirmed"  # a driver that neither answers nor is known to have ended


def _fence(ctx: JobContext, upgrade: Upgrade, new: Deployment, settings: UpgradeSettings) -> str | None:
    """Make sure the new version can no longer publish, and say whether it did. Its `withdraw` is always sent (a
    driver paused now reads it when it runs again, and declines the publish anyway: its upgrade no longer cuts
    over); a live driver answers it; one that does not is killed, and must be known to have ended. Then the live
    table, read as a log of several writers, says whether a commit of its query got in since the live savepoint.
    Returns what it published (a rollback is due), None (it cannot publish and did not), or UNCONFIRMED."""
    answer = _ask_within(ctx, upgrade, new, "withdraw", {}, settings.answer_seconds)
    if answer is None:
        _retire(ctx, new, stop_first=False)
        if not _ended(ctx, new):
            return UNCONFIRMED
    published = _published(ctx, upgrade, new)
    if published is None and answer is not None and answer.startswith("declined: it published"):
        published = answer  # its own word, where the table could not be read for it
    return published


def _withdraw_gate(ctx: JobContext, upgrade: Upgrade, old: Deployment, settings: UpgradeSettings) -> str | None:
    """Take the old version's gate back, whether or not it ever took it: an `ungate` is always sent (a driver
    paused, or a later attempt of it, reads it when it runs again, and never applies this upgrade's gate after
    it). Returns None or a note when it writes every window again (it said so, or it has ended with nothing left
    to the new version, or it was never asked to gate), the decline when it already left rows to the new version,
    or UNCONFIRMED."""
    answer = _ask_within(ctx, upgrade, old, "ungate", {}, settings.answer_seconds)
    if answer == "accepted":
        return None
    if answer is not None:
        return answer
    status, state = observe_deployment(ctx, old)
    gate = (status.gate if status else None) or {}
    ours = gate.get("role") == BLUE and gate.get("upgrade") == upgrade.id
    if not state.live and state is not State.LOST:
        if ours and gate.get("dropped"):
            return f"declined: it ended having left {gate['dropped']} rows ending after {gate.get('until_at')}"
        return f"the old deployment {old.id} is {state}: it writes nothing (deploy it again from its latest state)"
    if not ours and not _sent(ctx, old, _request_id(upgrade, "gate")):
        return f"the old deployment {old.id} is {state} and was never asked to gate"
    return UNCONFIRMED


def _wait_or_fail(ctx: JobContext, upgrade: Upgrade, settings: UpgradeSettings, why: str) -> Upgrade:
    """A recovery step that cannot confirm yet: it waits (the phase stays) for `answer_seconds` from when the
    recovery began, then the upgrade is FAILED with what each version writes."""
    if _in_phase_for(upgrade) < settings.answer_seconds:
        return upgrade
    upgrade.error = f"{why} within {settings.answer_seconds:.0f} s. {writers(ctx, upgrade)}"
    return upgrade.move(Phase.FAILED, upgrade.error)


def rolling_back(ctx: JobContext, upgrade: Upgrade) -> Upgrade:
    """From the cutover on: every deployment of the upgrade stopped, then the old version back from the
    savepoint taken before the new version wrote (blue/green: the live savepoint green started from; stop/restore:
    the stop-with-savepoint), its sink rewound to it (Delta's RESTORE and a new query id)."""
    for deployment_id in (upgrade.new_deployment, upgrade.old_deployment):
        if deployment_id:
            _retire(ctx, _deployment(ctx, deployment_id))
    for stray in _unnamed_launches(ctx, upgrade):
        _remove_launched(ctx, upgrade, stray)
    target = upgrade.rollback_savepoint or upgrade.savepoint
    result = rollback(sized(ctx, upgrade, new=False), target)
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
    an unreachable store leaves the phase as it was (resume later). Refused, doing nothing, while another
    process drives the upgrade (LeaseHeld), when the record moved on since it was read (UpgradeMovedOn), and
    while a person is asked to approve its launch."""
    if upgrade.phase.terminal:
        return upgrade
    step_ctx = step_context(ctx, upgrade)
    handler = HANDLERS[upgrade.phase]
    with operation(step_ctx, "upgrade"):
        Upgrades(step_ctx.store.storage).check(upgrade)  # read before the lease was ours: it may be stale
        if upgrade.awaits_approval:
            raise Refused(
                f"upgrade {upgrade.id} of job {upgrade.job} waits for a person to approve its launch (asked at "
                f"{upgrade.approval_asked_at}, in Airflow's Required Actions): nothing is launched before. Reject it "
                f"there; should its task be gone, the next `savepoints apply` or `savepoints upgrade {upgrade.job} "
                "--abort` aborts it once its lease expired"
            )
        try:
            upgrade = handler(step_ctx, upgrade)
        except (StoreUnavailable, BrokerUnavailable, LeaseHeld, LeaseLost, UpgradeMovedOn):
            raise  # transient, or someone else acts on the job or drives the upgrade: the phase stays
        except SavepointsError as exc:
            upgrade = _recover(upgrade, exc)
            if upgrade.phase is Phase.FAILED:
                upgrade.error = f"{upgrade.error}. {_writers_or_why(step_ctx, upgrade)}"
        _save(step_ctx, upgrade)
    if upgrade.phase.terminal:
        _release(ctx, upgrade)
    return upgrade


# -- helpers


def new_health(ctx: JobContext, upgrade: Upgrade, settings: UpgradeSettings) -> Health:
    """The new deployment's health: `min_batches` batches past its start (green: past its publish, once it
    published), a Kafka lag that falls where asked, no error."""
    new = _deployment(ctx, upgrade.new_deployment)
    status, state = observe_deployment(ctx, new)  # a green YARN still has queued waits, within catch_up_seconds
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
        observed=state,
    )


def sized(ctx: JobContext, upgrade: Upgrade, *, new: bool) -> JobContext:
    """The context a launch of the upgrade runs in: a rescale's new size (`new`) or the size it leaves (a
    rollback); any other upgrade launches at the size the old deployment runs at, so that the job keeps the size the
    autoscaler gave it (as declared for a job without `autoscale`)."""
    size = upgrade.size if new else upgrade.from_size
    if size is None and upgrade.old_deployment:
        old = _deployment(ctx, upgrade.old_deployment)
        size = ctx.spec.size_of(old.master, old.spark_conf)
    return ctx.at_size(size)


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
    if answer is None and _published(
        ctx, upgrade, new
    ):  # it died publishing, after its commit got in: past the cutover
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
    """Send a gate request and wait for its answer (`answer_seconds`); None when the deployment is no longer
    running. No answer in time raises (the upgrade then aborts: the abort withdraws the request)."""
    limit = UpgradeSettings.of(upgrade.settings).answer_seconds
    answer = _ask_within(ctx, upgrade, deployment, action, values, limit)
    if answer is None and state_of(ctx, deployment).live:
        raise SavepointsError(
            f"deployment {deployment.id} did not answer the {action} request {_request_id(upgrade, action)} within "
            f"{limit:.0f} s (a running driver answers between two batches: is it paused, or a batch that long?)"
        )
    return answer


def _ask_within(
    ctx: JobContext, upgrade: Upgrade, deployment: Deployment, action: str, values: dict[str, int], limit: float
) -> str | None:
    """Send a gate request once (its id is the upgrade's and the action's, so a step run again sends nothing twice)
    and wait up to `limit` seconds for its answer while the deployment is live; None without one. The request names
    its upgrade, and a gate request expires when the wait ends: a driver never applies it later."""
    request_id = _request_id(upgrade, action)
    status = ctx.deployments.status(ctx.name, deployment.id)
    if status is not None and request_id in status.answers:
        return status.answers[request_id]
    if not _sent(ctx, deployment, request_id):
        expires = time.time() + limit if action == "gate" else None
        request = ControlRequest(
            id=request_id,
            action=action,
            gate=values,
            requested_by=f"upgrade {upgrade.id}",
            upgrade=upgrade.id,
            expires_at=expires,
        )
        ctx.deployments.request(ctx.name, deployment.id, request)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and state_of(ctx, deployment).live:
        status = ctx.deployments.status(ctx.name, deployment.id)
        if status is not None and request_id in status.answers:
            return status.answers[request_id]
        time.sleep(POLL_SECONDS)
    status = ctx.deployments.status(ctx.name, deployment.id)  # answered right before it ended
    return status.answers.get(request_id) if status is not None else None


def _request_id(upgrade: Upgrade, action: str) -> str:
    return f"rq-{action}-{upgrade.id}"


def _sent(ctx: JobContext, deployment: Deployment, request_id: str) -> bool:
    status = ctx.deployments.status(ctx.name, deployment.id)
    if status is not None and (request_id in status.answers or request_id in status.handled_requests):
        return True
    return any(r.id == request_id for r in ctx.deployments.requests(ctx.name, deployment.id))


def _asked_to_stop(ctx: JobContext, deployment: Deployment) -> bool:
    """Whether this step's stop request (its id derives from the step's request id: jobs/stop.py) reached the
    deployment: an earlier try of the step that died after asking."""
    request_id = stop_request_id(ctx)
    status = ctx.deployments.status(ctx.name, deployment.id)
    handled = status is not None and request_id in status.handled_requests
    return handled or any(r.id == request_id for r in ctx.deployments.requests(ctx.name, deployment.id))


def _published(ctx: JobContext, upgrade: Upgrade, new: Deployment) -> str | None:
    """What the new version committed to the live table since the live savepoint it started from (`batches 7..9
    of query <id> in <table>`), None when nothing: the table read as a log of several writers, since the old
    version commits between the new one's batches."""
    status = ctx.deployments.status(ctx.name, new.id)
    if status is None or not status.query_id or not upgrade.savepoint:
        return None  # its query never started: it wrote nothing anywhere
    for sink in ctx.store.get(ctx.name, upgrade.savepoint).sinks:
        if sink.get("kind") != DELTA:
            continue
        version = sink.get("version")
        table = ctx.open(sink["location"])
        batches = delta_sink.batches_after(table, status.query_id, -1 if version is None else int(version))
        if batches:
            return f"batches {min(batches)}..{max(batches)} of query {status.query_id} in {sink['location']}"
    return None


def _ended(ctx: JobContext, deployment: Deployment) -> bool:
    """Whether a deployment's driver is known to have ended: its process or YARN application gone, else its own
    last status terminal (a driver on another host)."""
    ended = driver_ended(deployment.launcher)
    if ended is not None:
        return ended
    status = ctx.deployments.status(ctx.name, deployment.id)
    return status is not None and status.state in (State.STOPPED, State.FAILED) and status.error_class != KILLED


def writers(ctx: JobContext, upgrade: Upgrade) -> str:
    """Which version writes which windows now, for a person: what a FAILED upgrade must say."""
    said = []
    for what, deployment_id in (("old", upgrade.old_deployment), ("new", upgrade.new_deployment)):
        if not deployment_id:
            continue
        deployment = _deployment(ctx, deployment_id)
        status, state = observe_deployment(ctx, deployment)
        said.append(
            f"the {what} deployment {deployment.id} ({deployment.version}) is {state}: {_writes(state, status)}"
        )
    return "; ".join(said) + (f". The upgrade's live savepoint is {upgrade.savepoint}" if upgrade.savepoint else "")


def _writers_or_why(ctx: JobContext, upgrade: Upgrade) -> str:
    try:
        return writers(ctx, upgrade)
    except SavepointsError as exc:  # the store itself may be what failed
        return f"Which version writes which windows could not be read ({exc}): see `savepoints status {ctx.name}`"


def clear_leftovers(ctx: JobContext, upgrade: Upgrade) -> str:
    """For an upgrade that ended: take its requests back from every deployment of it still running, so that none
    keeps a gate of it (an old version left gated: ungated) or stages for it (stopped). What `savepoints upgrade JOB
    --abort` does once the upgrade has ended; doing it again changes nothing. Refused, changing nothing else, where
    the old version already left rows to the new one: they are only in a rollback's reach."""
    settings = UpgradeSettings.of(upgrade.settings)
    done = []
    step = step_context(ctx, upgrade, keep=False)  # the upgrade's own holder: its steps' operations nest in it
    with operation(step, "upgrade"):
        for deployment_id in (upgrade.old_deployment, upgrade.new_deployment):
            if not deployment_id:
                continue
            deployment = _deployment(step, deployment_id)
            status, state = observe_deployment(step, deployment)
            gate = (status.gate if status else None) or {}
            ours = gate.get("upgrade") == upgrade.id or gate.get("role") == STAGING
            if not state.live or not ours:
                continue
            if gate.get("role") == BLUE:
                answer = _withdraw_gate(step, upgrade, deployment, settings)
                if answer is UNCONFIRMED or (answer or "").startswith("declined"):
                    raise Refused(
                        f"deployment {deployment.id} keeps the gate of upgrade {upgrade.id}: {answer}. Roll the job "
                        f"back to the upgrade's live savepoint: `savepoints deploy {ctx.name} --restore "
                        f"{upgrade.savepoint} --rewind-sink` after `savepoints stop {ctx.name}`"
                    )
                done.append(f"{deployment.id} ungated: it writes every window again")
            elif gate.get("role") == STAGING:
                _ask_within(step, upgrade, deployment, "withdraw", {}, settings.answer_seconds)
                _retire(step, deployment)
                done.append(f"{deployment.id} (staging for it) stopped")
    return "; ".join(done) or f"nothing of upgrade {upgrade.id} is left in a running deployment"


def _writes(state: State, status: DeploymentStatus | None) -> str:
    gate = (status.gate if status else None) or {}
    role, after, until = gate.get("role"), gate.get("after_at"), gate.get("until_at")
    if state is State.LOST:
        how = f"its last status: {role}" + (f" until {until}" if until else "") + (f" after {after}" if after else "")
        return f"it writes nothing while its driver is silent ({how}; it resumes so if it runs again)"
    if not state.live:
        return "it writes nothing"
    if role == STAGING:
        return "it writes only its staging table"
    if role == BLUE:
        dropped = gate.get("dropped", 0)
        return f"it writes the windows ending at or before {until}, and drops the rest ({dropped} rows so far)"
    if role == GREEN or after:
        return f"it writes the windows ending after {after}"
    return "it writes every window"


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


def _retire(ctx: JobContext, deployment: Deployment, *, stop_first: bool = True) -> None:
    """Stop a deployment that is live (kill it if it will not stop, or at once without `stop_first`); nothing for
    one that ended."""
    state = state_of(ctx, deployment)
    if state.live and stop_first:
        try:
            stop(ctx, deployment_id=deployment.id)
            return
        except SavepointsError as exc:
            log.warning("stopping %s failed (%s); killing it", deployment.id, exc)
    if state.live or state is State.LOST:
        with contextlib.suppress(Refused):
            kill(ctx, deployment.id)


def _in_phase_for(upgrade: Upgrade) -> float:
    """Seconds since the upgrade entered its current phase."""
    entered = next((e["at"] for e in reversed(upgrade.history) if e["phase"] == str(upgrade.phase)), None)
    return 0.0 if entered is None else time.time() - int(_millis(entered) or 0) / 1000


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
    with operation(step_context(ctx, upgrade, keep=False), "upgrade"):
        pass
