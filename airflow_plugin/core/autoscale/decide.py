"""The autoscaler's decision, pure (like the reconcile plan): the same load, policy and history give the same
Recommendation. The rules, in order (Flink's autoscaler, FLIP-271, read for micro-batches):

    a rescale in the last `cooldown`            KEEP: the new size's own load is read first
    the load covers less than `window`          KEEP: a deployment is judged on a whole window of its own
    scale-up: utilisation above the target and the backlog growing across `window` (or, with no backlog to
    read, batches back to back): the size that runs the arrivals at the target utilisation and works the backlog
    off within `catch_up`, assuming the processing rate grows with the size
        at `max` already                        KEEP, behind at max: the alert's case
        the last scale-up did not help          HOLD: it raised the processing rate by less than a tenth of what
                                                it should have (a bottleneck elsewhere: a source, a sink, a skewed
                                                key); not scaled up again until the jobs file changes or
                                                `apply --retry` (apply.py `held`)
        the rescale does not pay                KEEP: the backlog is worked off sooner at this size than through
                                                the restart a rescale costs (the last rescale's measured time,
                                                else `restart_time`)
    scale-down: over `scale_down_window` the utilisation below target - boundary and the backlog at its floor:
        the size that runs the arrivals at the target, at least half the current one and `min`
    a rescale budget of `max_rescales_per_hour` spent: KEEP, saying so
    else                                        KEEP

Every recommendation's figures carry the state as last seen (StateSeen: its rows, its bytes and the skew of its
partitions by bytes at the newest snapshot); a scale-up or a hold on a skewed state says so: the largest
partition's work runs in one task slot whatever the size."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from .load import BUCKET_S, Figures, covered, figures, span, window
from .policy import Autoscale, Knob, Partitions

SKEWED = 2.0  # the largest state partition this many times the mean: one slot holds the job back
BACK_TO_BACK = 0.95  # a utilisation this high: batches run back to back (no backlog figure needed to see it)
EFFECTIVE = 0.1  # a scale-up that gave less than this share of the processing rate it should have: ineffective
SCALE_DOWN_FACTOR = 0.5  # a scale-down keeps at least this share of the size


class Direction(StrEnum):
    KEEP = "keep"
    UP = "up"
    DOWN = "down"
    HOLD = "hold"  # a scale-up is needed and was refused (an ineffective one before): a person looks


@dataclass(frozen=True)
class Rescale:
    """One rescale the autoscaler began (the reconcile record keeps them, newest last)."""

    at: float  # epoch seconds
    from_size: int
    to_size: int
    reason: str
    figures: dict[str, Any]  # the window it read
    partitions: int | None = None  # the state's new partitions, when they changed
    upgrade: str | None = None  # the upgrade that carried it out
    outcome: str | None = None  # the upgrade's end: DONE, ROLLED_BACK, ...
    seconds: float | None = None  # from its start to the cutover: what a rescale costs this job
    effective: bool | None = None  # a scale-up's check, once judged

    @property
    def pending(self) -> bool:
        """No upgrade's end is recorded on it: under way, or the apply carrying it was killed before it began its
        upgrade or recorded how it ended (the next apply goes on with it: reconcile/plan.py)."""
        return self.upgrade is None and self.outcome is None

    @property
    def request_id(self) -> str:
        return rescale_request_id(self.at)


def rescale_request_id(at: float) -> str:
    """The request a rescale recorded at `at` begins its upgrade under (upgrades/run.py `begin`): the apply that goes
    on with it after a kill finds the upgrade it began, if it began one."""
    return f"rescale-{at:.6f}"


@dataclass(frozen=True)
class StateSeen:
    """The running deployment's state, as last seen: the rows its heartbeat reports (Spark's progress, summed over
    its stateful operators), and at its newest snapshot the bytes and the skew of its partitions by bytes (the
    largest of its operators'; snapshots/state_stats.py)."""

    rows: int | None = None
    bytes: int | None = None
    skew: float | None = None  # the largest partition against the mean (1.0: even)
    snapshot: str | None = None  # the snapshot the bytes and skew are of

    def to_dict(self) -> dict[str, Any]:
        figures = {"state_rows": self.rows, "state_bytes": self.bytes, "state_skew": self.skew}
        return {key: value for key, value in figures.items() if value is not None} | (
            {"state_of": self.snapshot} if self.snapshot else {}
        )


@dataclass(frozen=True)
class ScalingSeen:
    """What a decision reads of one running job."""

    policy: Autoscale
    knob: Knob
    size: int
    slots_per_unit: int  # task slots a unit of the knob gives (an executor's cores)
    partitions: int | None  # the state's partitions now (None: a query without state, whose size they do not cap)
    load: list[dict[str, Any]]  # the running deployment's (its heartbeat's `load`)
    now: float
    history: list[Rescale] = field(default_factory=list)
    ineffective_held: bool = False  # an ineffective scale-up was found, and no one cleared it (`apply --retry`)
    # Spark can repartition the state (RocksDB's): else its partitions cap the size, as with partitions = "fixed"
    repartitionable: bool = True
    state: StateSeen = field(default_factory=StateSeen)


@dataclass(frozen=True)
class Recommendation:
    direction: Direction
    size: int  # the recommended size (the current one unless UP or DOWN)
    current: int
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)
    partitions: int | None = None  # UP past the state's partitions: repartitioned to these
    behind_at_max: bool = False  # the job falls behind at its max size
    effective: bool | None = None  # the last scale-up's check, judged now (None: not judged here)

    @property
    def acts(self) -> bool:
        return self.direction in (Direction.UP, Direction.DOWN)

    def describe(self) -> str:
        if self.acts:
            return f"{self.direction} from {self.current} to {self.size}: {self.reason}"
        return f"{self.direction} at {self.current}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "direction": str(self.direction),
            "size": self.size,
            "current": self.current,
            "reason": self.reason,
            "figures": self.figures,
            **({"partitions": self.partitions} if self.partitions else {}),
            **({"behind_at_max": True} if self.behind_at_max else {}),
            **({"effective": self.effective} if self.effective is not None else {}),
        }


def decide(seen: ScalingSeen) -> Recommendation:
    recommendation = _decide(seen)
    if not recommendation.figures:  # judged on no window of load: nothing read to record
        return recommendation
    reason = recommendation.reason
    skew = seen.state.skew
    if recommendation.direction in (Direction.UP, Direction.HOLD) and skew is not None and skew >= SKEWED:
        reason += (
            f"; its state is skewed (the largest partition {skew:g}x the mean): that partition's work runs in one "
            "task slot whatever the size"
        )
    return replace(recommendation, reason=reason, figures={**recommendation.figures, **seen.state.to_dict()})


def _decide(seen: ScalingSeen) -> Recommendation:
    policy, size, now = seen.policy, seen.size, seen.now
    keep = Recommendation(Direction.KEEP, size, size, "")
    last = seen.history[-1] if seen.history else None
    if last is not None and now - last.at < policy.cooldown:
        return _with(keep, f"rescaled to {last.to_size} {now - last.at:.0f} s ago (cooldown {policy.cooldown:g} s)")
    if covered(seen.load, now - policy.window, now) < policy.window - 1:
        have = covered(seen.load, now - policy.window, now)
        return _with(keep, f"its load covers {have:.0f} s of the {policy.window:g} s window: judged on a whole one")
    short = figures(window(seen.load, policy.window, now), span(policy.window, now))
    effective = _effective(seen, short)
    up = _scale_up(seen, short)
    if up is not None:
        if up.direction is Direction.UP and (effective is False or seen.ineffective_held):
            rate = f"{short.processing_rate:.1f}" if short.processing_rate else "unknown"
            return Recommendation(
                Direction.HOLD,
                size,
                size,
                f"falls behind ({up.reason}), but the last scale-up did not raise the processing rate (now {rate} "
                "rows/s) by a tenth of what it should have: a bottleneck elsewhere (a source, the sink, a skewed key); "
                "not scaled up again until the jobs file changes or `savepoints apply --retry`",
                short.to_dict(),
                effective=effective,
            )
        return _budgeted(seen, up, effective)
    down = _scale_down(seen)
    if down is not None:
        return _budgeted(seen, down, effective)
    u = f"utilisation {short.utilization:.2f}, target {policy.target_utilization:g}"
    if (short.backlog_growth or 0) > _noise(short) and short.utilization <= policy.target_utilization:
        return Recommendation(
            Direction.KEEP,
            size,
            size,
            f"the backlog grew by {short.backlog_growth} records in {short.seconds:.0f} s while the job was busy only "
            f"{short.utilization:.0%} of the time: its reads are capped (the source's maxOffsetsPerTrigger, or a "
            "trigger longer than its batches), not its size; raise the cap in the job",
            short.to_dict(),
            effective=effective,
        )
    return Recommendation(Direction.KEEP, size, size, f"{u}: keeps up", short.to_dict(), effective=effective)


def _noise(figures: Figures) -> float:
    """How much a backlog moves by chance: what arrives in one bucket. A backlog that grew by less across a window
    is steady (batches end at random points of the arrivals), one within it of its floor is at its floor."""
    return figures.arrival_rate * BUCKET_S


def _scale_up(seen: ScalingSeen, short: Figures) -> Recommendation | None:
    policy, size = seen.policy, seen.size
    if short.utilization <= policy.target_utilization:
        return None
    if short.backlog is not None:
        if (short.backlog_growth or 0) <= _noise(short):
            return None
        behind = f"the backlog grew by {short.backlog_growth} records in {short.seconds:.0f} s, to {short.backlog}"
    elif short.utilization >= BACK_TO_BACK:
        behind = f"batches ran back to back ({short.utilization:.0%} of {short.seconds:.0f} s)"
    else:
        return None
    why = f"utilisation {short.utilization:.2f} above the target {policy.target_utilization:g}; {behind}"
    top, most = policy.max, f"autoscale.max {policy.max}"
    if not _follows(seen) and seen.partitions is not None:
        fits = max(1, seen.partitions // seen.slots_per_unit)  # partitions kept: a size is capped at them
        if fits < top:
            why_kept = "autoscale.partitions = fixed" if seen.repartitionable else "a state Spark cannot repartition"
            top, most = fits, f"the state's {seen.partitions} partitions ({why_kept})"
    if size >= top:
        return Recommendation(
            Direction.KEEP,
            size,
            size,
            f"{why}: at {most} already",
            short.to_dict(),
            behind_at_max=True,
        )
    backlog = short.backlog or 0
    needed_rate = short.arrival_rate / policy.target_utilization + backlog / policy.catch_up
    # busy with nothing processed: no rate to size by, double
    wanted = math.ceil(size * needed_rate / short.processing_rate) if short.processing_rate else size * 2
    target = min(top, max(wanted, size + 1))
    pays = _pays(seen, short, target)
    if pays is not None:
        return Recommendation(Direction.KEEP, size, size, f"{why}; to {target} would not pay: {pays}", short.to_dict())
    return Recommendation(
        Direction.UP,
        target,
        size,
        f"{why}; {target} runs {short.arrival_rate:.1f} rows/s at the target and the backlog off in "
        f"{policy.catch_up:g} s",
        short.to_dict(),
        partitions=_partitions(seen, target),
    )


def _scale_down(seen: ScalingSeen) -> Recommendation | None:
    policy, size, now = seen.policy, seen.size, seen.now
    if size <= policy.min:
        return None
    if covered(seen.load, now - policy.scale_down_window, now) < policy.scale_down_window - 1:
        return None
    long = figures(window(seen.load, policy.scale_down_window, now), span(policy.scale_down_window, now))
    quiet = policy.target_utilization - policy.boundary
    if long.utilization >= quiet:
        return None
    noise = _noise(long)
    if long.backlog is not None and (
        (long.backlog_growth or 0) > noise or long.backlog > (long.backlog_floor or 0) + noise
    ):
        return None
    if long.processing_rate:
        wanted = math.ceil(size * long.arrival_rate / policy.target_utilization / long.processing_rate)
    else:
        wanted = policy.min  # nothing arrived in the whole window
    target = max(policy.min, wanted, math.ceil(size * SCALE_DOWN_FACTOR))
    if target >= size:
        return None
    return Recommendation(
        Direction.DOWN,
        target,
        size,
        f"utilisation {long.utilization:.2f} under {quiet:g} for {long.seconds:.0f} s, the backlog at its floor: "
        f"{target} runs {long.arrival_rate:.1f} rows/s at the target",
        long.to_dict(),
    )


def _pays(seen: ScalingSeen, short: Figures, target: int) -> str | None:
    """Why a scale-up to `target` does not pay for its restart, or None when it does: the backlog is worked off
    sooner at the current size than through the restart and the new size (processing rate linear in the size)."""
    rate, arrival, backlog = short.processing_rate, short.arrival_rate, short.backlog or 0
    if not rate or backlog == 0 or rate <= arrival:
        return None  # it cannot catch up at this size, or there is nothing to catch up: the rescale is the way
    restart = _restart_seconds(seen)
    now_done = backlog / (rate - arrival)
    new_rate = rate * target / seen.size
    then_done = restart + (backlog + arrival * restart) / (new_rate - arrival)
    if then_done < now_done:
        return None
    return (
        f"the backlog of {backlog} is worked off in {now_done:.0f} s at this size, in {then_done:.0f} s through a "
        f"{restart:.0f} s rescale"
    )


def _restart_seconds(seen: ScalingSeen) -> float:
    measured = [r.seconds for r in seen.history if r.seconds is not None]
    return measured[-1] if measured else seen.policy.restart_time


def _effective(seen: ScalingSeen, short: Figures) -> bool | None:
    """The last scale-up's check, once the new size has a window of its own and is still loaded (a job that caught
    up shows no rate worth judging): False when it raised the processing rate by less than EFFECTIVE of what the
    size should have given."""
    last = seen.history[-1] if seen.history else None
    if last is None or last.to_size <= last.from_size or last.effective is not None or last.outcome != "DONE":
        return None
    before = last.figures.get("processing_rate")
    if not before or not short.processing_rate or short.utilization <= seen.policy.target_utilization:
        return None
    expected = before * (last.to_size / last.from_size - 1)
    return (short.processing_rate - before) >= EFFECTIVE * expected


def _partitions(seen: ScalingSeen, target: int) -> int | None:
    """The state partitions `target` needs, None when the current ones serve it (or the policy keeps them): a
    scale-down never shrinks them."""
    wanted = target * seen.slots_per_unit
    if not _follows(seen) or seen.partitions is None or wanted <= seen.partitions:
        return None
    return wanted


def _follows(seen: ScalingSeen) -> bool:
    """Whether the state's partitions follow the size: the policy lets them, and Spark can repartition the state."""
    return seen.policy.partitions is Partitions.FOLLOW and seen.repartitionable


def _budgeted(seen: ScalingSeen, rescale: Recommendation, effective: bool | None) -> Recommendation:
    if not rescale.acts:  # a KEEP (behind at max, a rescale that would not pay) spends no budget and says why
        return replace(rescale, effective=effective)
    recent = [r for r in seen.history if r.at > seen.now - 3600]
    if len(recent) >= seen.policy.max_rescales_per_hour:
        return Recommendation(
            Direction.KEEP,
            seen.size,
            seen.size,
            f"would scale {rescale.direction} to {rescale.size} ({rescale.reason}), but {len(recent)} rescales in the "
            f"last hour spent autoscale.max_rescales_per_hour ({seen.policy.max_rescales_per_hour})",
            rescale.figures,
            effective=effective,
        )
    return Recommendation(
        rescale.direction,
        rescale.size,
        rescale.current,
        rescale.reason,
        rescale.figures,
        rescale.partitions,
        effective=effective,
    )


def _with(keep: Recommendation, reason: str) -> Recommendation:
    return Recommendation(keep.direction, keep.size, keep.current, reason)
