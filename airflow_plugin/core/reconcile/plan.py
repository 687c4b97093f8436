"""The reconcile loop's decision, pure: what one declared job needs now, from what was observed (`Observed`: its
desired state, its newest deployment, an upgrade in progress, what the loop recorded) to one `Step`, as data
(`savepoints apply --dry-run` prints it; apply.py carries it out). No I/O here: the same facts give the same step.

The rules, in order:

    paused by a person                          PAUSED: the loop leaves the job alone
    an upgrade in progress                      the loop's own: RESUME_UPGRADE; a person's: WAIT for it, unless
                                                its approval was abandoned (the task that asked is gone, its
                                                lease expired): ABORT_UPGRADE (nothing was launched)
    desired stopped                             a live deployment: STOP (with a savepoint); else NOTHING
    a deployment starting or stopping           WAIT: look again at the next apply
    the newest deployment FAILED or LOST        a restart recorded and then cut short (the loop was killed
                                                before its deploy): RESTART at once, counted once; a failure
                                                no restart mends (a guard's refusal, an incompatible state, a
                                                script the runtime refused, a person's kill): HOLD; the budget
                                                spent (`restart.attempts` in `restart.window`, every attempt
                                                counted, one whose deploy was refused too): BUDGET_SPENT; its
                                                restarts refused at deploy with the same error 3 times: HOLD;
                                                before its delay (from the failure, or from the last attempt):
                                                WAIT; else RESTART from its latest state (a LOST driver not
                                                surely gone is killed first)
    nothing ran yet                             DEPLOY the desired version from `desired.restore`
    the last one was stopped                    DEPLOY the desired version from its latest state: a stop (a
                                                person's, without a savepoint) leaves newer state than any
                                                savepoint `desired.restore` may name
    running another version than desired       that version failed under this declaration: HOLD; else UPGRADE
    running the desired version                with `autoscale`: a rescale the record holds without an outcome
                                                (the apply that recorded it was killed) goes on, counted once:
                                                its upgrade ended (its outcome is recorded: RESCALE), or none was
                                                begun and, within its cooldown, the job runs at the size it leaves
                                                (RESCALE to its size);
                                                else the autoscaler's decision (core/autoscale/decide.py): a scale
                                                up or down RESCALEs (an upgrade to the same version at the new
                                                size), unless the autoscaler is passive;
                                                else NOTHING (it is the last stable version)

The loop keeps a job at the size it runs at: a restart and a redeploy after a stop launch at the size of the
deployment they follow (an upgrade's steps do the same: upgrades/steps.py `sized`); only a first start runs at the
size the jobs file declares."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from enum import StrEnum

from ..autoscale.decide import Recommendation, ScalingSeen, decide
from ..autoscale.policy import Mode as ScalingMode
from ..jobs.spec import DEFAULT_RESTORE, STOPPED, Desired, RestartPolicy
from ..records.deployment import State
from .record import Reconciled

APPLY = "savepoints apply"  # who the loop's operations are requested by (an upgrade it began is its own to resume)
# error classes a restart cannot mend: the same start would be refused again, or a person decided
NOT_RETRYABLE = frozenset(
    {
        "SINK_AHEAD",  # the sink holds batches after the state's: a restart would skip them (guards/sink.py)
        "DELIVERY_GUARANTEE_NOT_MET",  # the job's source or sink cannot give the declared guarantee
        "JOB_ARGUMENTS_REJECTED",  # the jobs file's arguments
        "SEED_REFUSED",
        "MIGRATION_FAILED",
        "KILLED",  # a person's `savepoints kill`
    }
)
NOT_RETRYABLE_PREFIXES = ("SCRIPT_", "STATE_STORE_", "STATE_SCHEMA", "INCOMPATIBLE_")  # a script refused; a state
# the version cannot read
JITTER = 0.2  # each delay is drawn in +-20% around its exponential value, the same for one failure every time
# restarts of one failed deployment refused at deploy with the same error this many times in a row: the deploy is
# refused for a reason a restart does not change (no state, a source gap), held for a person before the budget
SAME_REFUSALS = 3


class Action(StrEnum):
    NOTHING = "NOTHING"
    PAUSED = "PAUSED"
    WAIT = "WAIT"
    DEPLOY = "DEPLOY"
    RESTART = "RESTART"
    UPGRADE = "UPGRADE"
    RESCALE = "RESCALE"  # an upgrade to the running version at another size: the autoscaler's
    RESUME_UPGRADE = "RESUME_UPGRADE"
    ABORT_UPGRADE = "ABORT_UPGRADE"  # a person's upgrade whose approval was abandoned: aborted before any launch
    STOP = "STOP"
    HOLD = "HOLD"  # a failure no restart mends, or a version that failed: a person looks
    BUDGET_SPENT = "BUDGET_SPENT"  # restarted `attempts` times in the window: left FAILED, alerting

    @property
    def acts(self) -> bool:
        return self in (Action.DEPLOY, Action.RESTART, *UPGRADES, Action.STOP)


# the steps carried out as an upgrade, outside the loop's own lease (the upgrade takes the job's its own way)
UPGRADES = (Action.UPGRADE, Action.RESCALE, Action.RESUME_UPGRADE, Action.ABORT_UPGRADE)


@dataclass(frozen=True)
class Seen:
    """A deployment as the observer saw it."""

    id: str
    version: str
    state: State
    error_class: str | None = None
    error: str | None = None
    updated_at: float | None = None  # its last heartbeat (when it failed, for a FAILED one)
    last_batch_id: int | None = None
    gone: bool = False  # its driver surely ended (a local process that is gone): nothing to kill
    size: int | None = None  # the size it runs at on the autoscaler's knob (None: the job has no autoscale)


@dataclass(frozen=True)
class UpgradeSeen:
    id: str
    phase: str
    to_version: str
    by_loop: bool
    abandoned: str | None = None  # why its approval was abandoned (upgrades/run.py `abandoned`): it is aborted


@dataclass(frozen=True)
class Observed:
    job: str
    desired: Desired | None
    restart: RestartPolicy
    fingerprint: str
    now: float
    deployment: Seen | None = None  # the newest live deployment, else the newest one
    upgrade: UpgradeSeen | None = None  # one that has not ended
    record: Reconciled = field(default_factory=lambda: Reconciled(""))
    scaling: ScalingSeen | None = None  # the autoscaler's view of the running desired version, if it has one
    # the upgrade begun for the record's newest rescale, when it has no outcome (Rescale.pending): (its id, phase)
    rescale_upgrade: tuple[str, str] | None = None


@dataclass(frozen=True)
class Step:
    job: str
    action: Action
    reason: str
    version: str | None = None  # what DEPLOY, RESTART or UPGRADE starts; NOTHING's: the desired one, running
    restore: str | None = None
    mode: str | None = None  # an UPGRADE's
    failed: Seen | None = None  # what a RESTART replaces
    kill_first: bool = False  # a LOST driver not surely gone: killed before the restart (one writer)
    not_before: float | None = None  # a WAIT for a restart's delay: when it is due
    size: int | None = None  # the size DEPLOY, RESTART or RESCALE launches at (None: as declared)
    from_size: int | None = None  # a RESCALE's: the size it leaves (what a rollback restores)
    partitions: int | None = None  # a RESCALE's: the state's new partitions, when they change
    recommendation: Recommendation | None = None  # the autoscaler's, which the step carries out or records
    rescaled_at: float | None = None  # a RESCALE recorded already (Rescale.at): it goes on, not recorded again

    def describe(self) -> str:
        return f"{self.job}: {self.action} - {self.reason}"


def retryable(error_class: str | None) -> bool:
    if error_class is None:
        return True
    return error_class not in NOT_RETRYABLE and not error_class.startswith(NOT_RETRYABLE_PREFIXES)


def restart_delay(policy: RestartPolicy, attempt: int, seed: str) -> float:
    """The wait before restart number `attempt` (0-based within the window): `delay` doubled each time, capped at
    `max_delay`, with jitter drawn from the failed deployment's id (the same for one failure at every look)."""
    base = min(policy.max_delay, policy.delay * 2**attempt)
    jittered = base * random.Random(seed).uniform(1 - JITTER, 1 + JITTER)
    return min(policy.max_delay, jittered)


def plan(seen: Observed) -> Step:
    job, desired, deployment, record = seen.job, seen.desired, seen.deployment, seen.record
    if desired is None:
        return Step(job, Action.NOTHING, "no `desired` in the jobs file: the job is left to people")
    if record.paused_by:
        return Step(job, Action.PAUSED, f"paused by {record.paused_by} at {record.paused_at} (`apply --resume`)")
    if seen.upgrade is not None:
        upgrade = seen.upgrade
        if upgrade.abandoned:
            return Step(job, Action.ABORT_UPGRADE, f"upgrade {upgrade.id} to {upgrade.to_version}: {upgrade.abandoned}")
        if upgrade.by_loop:
            return Step(
                job, Action.RESUME_UPGRADE, f"its upgrade {upgrade.id} to {upgrade.to_version} is at {upgrade.phase}"
            )
        return Step(job, Action.WAIT, f"a person's upgrade {upgrade.id} to {upgrade.to_version} is at {upgrade.phase}")
    if desired.state == STOPPED:
        if deployment is not None and deployment.state is State.RUNNING:
            return Step(job, Action.STOP, f"desired stopped; {deployment.id} ({deployment.version}) runs")
        if deployment is not None and deployment.state.live:
            return Step(job, Action.WAIT, f"desired stopped; {deployment.id} is {deployment.state}")
        return Step(job, Action.NOTHING, "desired stopped, and nothing runs")
    if deployment is not None and deployment.state.live and deployment.state is not State.RUNNING:
        return Step(job, Action.WAIT, f"{deployment.id} is {deployment.state}")
    if deployment is not None and deployment.state in (State.FAILED, State.LOST):
        return _after_failure(seen, deployment)
    if deployment is None:
        return Step(job, Action.DEPLOY, "nothing ran yet", version=desired.version, restore=desired.restore)
    if deployment.state is State.STOPPED:
        # desired.restore is a first start's: after a stop without a savepoint an older snapshot would write its
        # batches' output again (Kafka, foreachBatch) or be refused on every run (a file or Delta sink)
        why = f"{deployment.id} was stopped: from its latest state"
        if desired.restore != DEFAULT_RESTORE:
            why += f" (desired.restore {desired.restore} is a first start's only)"
        return Step(job, Action.DEPLOY, why, version=desired.version, restore=DEFAULT_RESTORE, size=deployment.size)
    # RUNNING
    if deployment.version != desired.version:
        failed_under = record.failed_versions.get(desired.version)
        if failed_under == seen.fingerprint:
            return Step(
                job,
                Action.HOLD,
                f"{desired.version} failed under this declaration and {deployment.version} was kept: not tried again "
                f"until the jobs file changes, or `savepoints apply {job} --retry`",
            )
        return Step(
            job,
            Action.UPGRADE,
            f"{deployment.id} runs {deployment.version}, desired {desired.version}",
            version=desired.version,
            mode=desired.upgrade_mode,
        )
    running = Step(
        job, Action.NOTHING, f"{deployment.id} runs {deployment.version}, as desired", version=deployment.version
    )
    if seen.scaling is None:
        return running
    return _pending_rescale(seen, running, deployment) or _autoscaled(running, seen.scaling, desired, deployment)


def _pending_rescale(seen: Observed, running: Step, deployment: Seen) -> Step | None:
    """The record's newest rescale, when the apply that recorded it was killed before its end was recorded: it goes
    on (counted once) where its upgrade ended, or where none was begun, within the cooldown it started, while the
    job runs the size it leaves and the autoscaler is active (else the autoscaler decides anew)."""
    assert seen.scaling is not None and seen.desired is not None
    pending = seen.record.rescales[-1] if seen.record.rescales else None
    if pending is None or not pending.pending:
        return None
    rescale = Step(
        running.job,
        Action.RESCALE,
        "",
        version=deployment.version,
        mode=rescale_mode(pending.partitions, seen.desired),
        size=pending.to_size,
        from_size=pending.from_size,
        partitions=pending.partitions,
        rescaled_at=pending.at,
    )
    what = f"its rescale from {pending.from_size} to {pending.to_size}"
    if seen.rescale_upgrade is not None:
        upgrade, phase = seen.rescale_upgrade
        return replace(rescale, reason=f"{what} ended {phase} (upgrade {upgrade}): its outcome is recorded")
    policy = seen.scaling.policy
    if deployment.size != pending.from_size or policy.mode is not ScalingMode.ACTIVE:
        return None
    if seen.now - pending.at >= policy.cooldown:
        return None
    return replace(rescale, reason=f"{deployment.id} runs {deployment.version}; {what} was recorded: it goes on")


def rescale_mode(partitions: int | None, desired: Desired) -> str:
    """A rescale's upgrade mode. Spark repartitions a state only at a batch boundary: a stop's savepoint is one, a
    live savepoint of a job too busy to keep up seldom is (rescale.py check_rescalable)."""
    return "stop_restore" if partitions else desired.upgrade_mode


def _autoscaled(running: Step, scaling: ScalingSeen, desired: Desired, deployment: Seen) -> Step:
    """The running desired version as the autoscaler sees it: RESCALE to its recommendation, or (passive, or
    nothing to do) NOTHING, the recommendation carried for the record."""
    recommendation = decide(scaling)
    # "scale up from 2 to 4: ...", naming the knob and the state's new partitions: a dry run says what would change
    what = ("scale " if recommendation.acts else "") + recommendation.describe()
    if recommendation.partitions:
        what += f" (the state repartitioned to {recommendation.partitions} partitions)"
    on = f"autoscale on {scaling.knob}"
    said = f"{running.reason}; {on}: {what}"
    if recommendation.acts and scaling.policy.mode is ScalingMode.ACTIVE:
        return Step(
            running.job,
            Action.RESCALE,
            f"{deployment.id} runs {deployment.version}; {on}: {what}",
            version=deployment.version,
            mode=rescale_mode(recommendation.partitions, desired),
            size=recommendation.size,
            from_size=recommendation.current,
            partitions=recommendation.partitions,
            recommendation=recommendation,
        )
    if recommendation.acts:
        said = f"{running.reason}; {on} (passive, not acted on): {what}"
    return replace(running, reason=said, recommendation=recommendation)


def _after_failure(seen: Observed, failed: Seen) -> Step:
    job, policy, record = seen.job, seen.restart, seen.record
    why = f"{failed.id} ({failed.version}) is {failed.state}" + (
        f": {failed.error_class}" if failed.error_class else ""
    )
    tried = [r for r in record.restarts if r.failed == failed.id]  # the loop's attempts to restart this one
    recent = record.counted(policy, seen.now)
    restart = Step(
        job,
        Action.RESTART,
        "",
        version=failed.version,
        restore=DEFAULT_RESTORE,
        failed=failed,
        kill_first=failed.state is State.LOST and not failed.gone,
        size=failed.size,
    )
    if any(r.pending for r in tried):  # recorded, then the loop was killed before its deploy: it goes on, counted once
        return replace(restart, reason=f"{why}; its restart {len(recent)} of {policy.attempts} goes on")
    # once the loop tried, a KILLED is its own kill of a LOST driver, and the failure one it judged retryable
    if not tried and not retryable(failed.error_class):
        return Step(
            job, Action.HOLD, f"{why}, which a restart does not mend: a person looks (`savepoints status {job}`)"
        )
    refused = tried[-1].error if tried else None
    said = f"; the last restart failed: {refused}" if refused else ""
    if len(recent) >= policy.attempts:
        return Step(
            job,
            Action.BUDGET_SPENT,
            f"{why}; restarted {len(recent)} times in the last {policy.window:g} s (restart.attempts "
            f"{policy.attempts}){said}: left {failed.state} for a person",
        )
    since = [r for r in tried if r.at >= (record.budget_from or 0)][-SAME_REFUSALS:]
    if len(since) == SAME_REFUSALS and refused and all(r.error == refused for r in since):
        return Step(
            job,
            Action.HOLD,
            f"{why}; its restart was refused {SAME_REFUSALS} times: {refused}: a restart does not mend it, a person "
            f"looks (then `savepoints apply {job} --retry`)",
        )
    last = max([failed.updated_at or seen.now, *(r.at for r in tried)])  # a refused restart waits its delay too
    due = last + restart_delay(policy, len(recent), failed.id)
    if seen.now < due:
        return Step(
            job, Action.WAIT, f"{why}; restart {len(recent) + 1} due in {due - seen.now:.0f} s{said}", not_before=due
        )
    return replace(restart, reason=f"{why}; restart {len(recent) + 1} of {policy.attempts} in the window{said}")
