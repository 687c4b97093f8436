"""Starting, driving, resuming and cancelling an upgrade: what the CLI's `savepoints upgrade`, the upgrade DAG's
tasks and the Savepoints page share (the steps themselves: steps.py). A person's approval of the launch is asked,
answered and, when the task that asked is gone, abandoned here too. Whatever writes the record holds the
upgrade's lease as its driver (steps.py `step_context`) and writes by compare-and-swap (record.py `Upgrades.put`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict

from ..errors import InvalidInput, NotFound, Refused, UpgradeFailed
from ..jobs.context import JobContext
from ..jobs.operation import operation
from ..lease import acquire, holder_gone, read_lease
from ..storage import Storage
from ..timestamps import utc_now
from .record import Mode, Phase, Upgrade, Upgrades, new_upgrade_id
from .steps import UpgradeSettings, advance, clear_leftovers, step_context

AUTO = "auto"  # the mode the pre-flight chooses: blue_green where it applies, else stop_restore
# phases that wait for the world (an abort: for a driver to confirm)
WAITING = frozenset({Phase.CATCHING_UP, Phase.RETIRING, Phase.CONFIRMING, Phase.ABORTING})


def begin(
    ctx: JobContext,
    version: str,
    *,
    mode: str | None = None,
    settings: UpgradeSettings | None = None,
    size: int | None = None,
    from_size: int | None = None,
    partitions: int | None = None,
) -> Upgrade:
    """Record a new upgrade of the job to `version` and take its lease. Refused while another upgrade of the job
    has not ended (resume or abort it) and while another operation holds the job; a retry of the same request
    (an Airflow task) gets the upgrade it began. `size`, `from_size`, `partitions`: a rescale's (Upgrade)."""
    ctx.spec.launchable(version)
    mode = None if mode in (None, "", AUTO) else mode
    if mode not in (None, *(m.value for m in Mode)):
        modes = ", ".join(m.value for m in Mode)
        raise InvalidInput(f"invalid upgrade mode {mode!r}: use {modes}, or {AUTO} (the pre-flight's choice)")
    upgrades = Upgrades(ctx.store.storage)
    request_id = ctx.settings.request_id
    newest = upgrades.newest(ctx.name)
    if request_id and newest is not None and newest.request_id == request_id:
        return newest  # a retried task adopts what its dead try began
    current = newest if newest is not None and not newest.phase.terminal else None
    if current is not None:
        raise Refused(
            f"job {ctx.name} has upgrade {current.id} to {current.to_version} in progress ({current.phase}): resume "
            f"it (`savepoints upgrade {ctx.name} --resume`) or cancel it (`savepoints upgrade {ctx.name} --abort`)"
        )
    upgrade = Upgrade(
        id=new_upgrade_id(),
        job=ctx.name,
        to_version=version,
        requested_mode=mode or None,
        settings=asdict(settings or UpgradeSettings()),
        requested_by=ctx.requested_by,
        request_id=request_id,
        size=size,
        from_size=from_size,
        partitions=partitions,
    )
    what = f"rescale of {version} from {from_size} to {size}" if size is not None else f"upgrade to {version}"
    upgrade.move(Phase.SAVEPOINTING, f"{what} requested" + (f", mode {mode}" if mode else ""))
    step = step_context(ctx, upgrade).settings
    lease = acquire(ctx.store.storage, ctx.name, str(step.holder), "upgrade", step.lease_ttl)
    lease.keep()  # the upgrade's steps take it back; nobody else may act on the job meanwhile
    upgrades.put(upgrade)  # a new record: created only if its id is free
    return upgrade


def current(ctx: JobContext, upgrade_id: str | None = None, *, ended: bool = False) -> Upgrade:
    """The given upgrade, or the job's unfinished one (`ended`: else its newest)."""
    upgrades = Upgrades(ctx.store.storage)
    if upgrade_id:
        return upgrades.get(ctx.name, upgrade_id)
    found = upgrades.newest(ctx.name) if ended else upgrades.in_progress(ctx.name)
    if found is None:
        raise NotFound(
            f"job {ctx.name} has no upgrade in progress: start one with `savepoints upgrade {ctx.name} --version V`"
        )
    return found


def run_upgrade(
    ctx: JobContext,
    upgrade: Upgrade,
    *,
    until: frozenset[Phase] | None = None,
    on_step: Callable[[Upgrade], None] | None = None,
    poll_seconds: float = 1.0,
) -> Upgrade:
    """Advance the upgrade step by step until it ends (or reaches a phase in `until`), waiting between looks
    while a step waits for the world. `on_step` sees the record after every step that changed its phase."""
    while not upgrade.phase.terminal and (until is None or upgrade.phase not in until):
        before = upgrade.phase
        upgrade = advance(ctx, upgrade)
        if upgrade.phase is not before:
            if on_step is not None:
                on_step(upgrade)
        elif upgrade.phase in WAITING:
            time.sleep(poll_seconds)
    return upgrade


def await_approval(ctx: JobContext, upgrade: Upgrade, seconds: float) -> Upgrade:
    """The upgrade waits up to `seconds` for a person to approve its launch (its savepoint and pre-flight done,
    nothing launched, the old version running on): its lease is kept for that long and a step more (`lease_seconds`),
    so that nobody else acts on the job meanwhile; should the task that asked be killed, the upgrade is `abandoned`
    once that lease expired. The wait is recorded."""
    if upgrade.phase is not Phase.LAUNCHING or upgrade.approved_by:
        raise InvalidInput(f"upgrade {upgrade.id} is {upgrade.phase}: only an unapproved launch waits for approval")
    upgrades = Upgrades(ctx.store.storage)
    with operation(step_context(ctx, upgrade, wait=seconds), "upgrade"):
        upgrades.check(upgrade)
        upgrade.approval_asked_at = utc_now()
        upgrade.move(upgrade.phase, f"waits up to {seconds:.0f}s for a person to approve the launch")
        upgrades.put(upgrade)
    return upgrade


def approve(ctx: JobContext, upgrade: Upgrade, by: str) -> Upgrade:
    """A person approved the launch: recorded under the upgrade's lease (its next step, the launch, goes on under
    it), so that a retried or resumed task does not ask again. Refused when the upgrade no longer waits for it (an
    abandoned approval aborted meanwhile: `abort_abandoned`), or moved on since it was read."""
    upgrades = Upgrades(ctx.store.storage)
    with operation(step_context(ctx, upgrade), "upgrade"):
        upgrades.check(upgrade)
        if upgrade.phase is not Phase.LAUNCHING or upgrade.approved_by:
            raise Refused(
                f"upgrade {upgrade.id} of job {upgrade.job} is {upgrade.phase}"
                + (f", approved by {upgrade.approved_by}" if upgrade.approved_by else "")
                + f": the approval by {by or 'unknown'} came too late and changes nothing"
            )
        upgrade.approved_by = by or "unknown"
        upgrade.move(upgrade.phase, f"launch approved by {upgrade.approved_by}")
        upgrades.put(upgrade)
    return upgrade


def abandoned(storage: Storage, upgrade: Upgrade) -> str | None:
    """Why an upgrade that waits for a person's approval is abandoned: nobody holds the job's lease any more (the
    wait's lease expired, was released, or its holder's process is seen gone), so the task that asked is gone and no
    answer reaches it. None while someone holds the lease (the answer may still come, or another operation acts on
    the job), and for an upgrade that awaits no approval."""
    if not upgrade.awaits_approval:
        return None
    lease = read_lease(storage, upgrade.job)
    if lease is None:
        how = "its lease was released"
    elif lease.expired():
        how = f"its lease ({lease.holder}) expired at {lease.expires_at}"
    elif holder_gone(lease.holder):
        how = f"its lease's holder {lease.holder} is gone"
    else:
        return None
    return (
        f"a person was asked to approve its launch at {upgrade.approval_asked_at} and {how} without an answer: the "
        "task that asked is gone"
    )


def abort_abandoned(ctx: JobContext) -> Upgrade | None:
    """Abort the job's upgrade if its approval is `abandoned`: nothing was launched, so this is a cancel (the old
    version never stopped), driven to its end here. None when there is nothing to abort (answered, or ended)."""
    upgrade = Upgrades(ctx.store.storage).in_progress(ctx.name)
    why = abandoned(ctx.store.storage, upgrade) if upgrade is not None else None
    if upgrade is None or why is None:
        return None
    return run_upgrade(ctx, cancel(ctx, upgrade, f"not approved: {why}"))


def cancel(ctx: JobContext, upgrade: Upgrade, why: str = "cancelled") -> Upgrade:
    """A person cancels (`why`: what the record says): before the cutover the upgrade aborts (the old version runs on,
    writing every window), after it the old version is rolled back. A FAILED upgrade tries the recovery it failed in
    again. An upgrade that ended otherwise has its requests taken back from every deployment of it still running
    (clear_leftovers: a gate left on the old version is withdrawn), which changes nothing when done again."""
    if upgrade.phase is Phase.FAILED and upgrade.recovery is not None:
        return upgrade.move(upgrade.recovery, "cancelled again: the recovery is tried again")
    if upgrade.phase.terminal:
        upgrades = Upgrades(ctx.store.storage)
        with operation(step_context(ctx, upgrade, keep=False), "upgrade"):
            upgrades.check(upgrade)
            note = clear_leftovers(ctx, upgrade)
            upgrade.move(upgrade.phase, f"cancelled after it ended: {note}")
            upgrades.put(upgrade)
        return upgrade
    if upgrade.phase not in (Phase.ABORTING, Phase.ROLLING_BACK):
        upgrade.error = why
        upgrade.move(Phase.ROLLING_BACK if upgrade.cut_over else Phase.ABORTING, why)
    return upgrade


def outcome(upgrade: Upgrade) -> None:
    """Raise unless the upgrade went through: BLOCKED is a refusal (exit 4), ABORTED, ROLLED_BACK and FAILED an
    upgrade that did not go through (exit 11)."""
    if upgrade.phase is Phase.DONE:
        return
    what = f"upgrade {upgrade.id} of job {upgrade.job} to {upgrade.to_version} {upgrade.phase}: {upgrade.error or '-'}"
    if upgrade.phase is Phase.BLOCKED:
        raise Refused(f"{what}. Nothing was changed")
    if upgrade.phase is Phase.ABORTED:
        raise UpgradeFailed(f"{what}. {upgrade.history[-1]['note'] if upgrade.history else 'Aborted'}")
    if upgrade.phase is Phase.ROLLED_BACK:
        raise UpgradeFailed(f"{what}. The old version was put back from savepoint {upgrade.rollback_savepoint}")
    raise UpgradeFailed(f"{what}. See `savepoints status {upgrade.job}` and the runbook")
