"""The autoscaler's pure parts (core/autoscale/): the decision on recorded load series (a ramp up, a spike shorter
than the window, a slow decline, a steady load, an ineffective and an effective scale-up, and each rule that keeps a
job as it is), the runtime's load buckets and the figures read off a window of them, and the jobs file's
`autoscale = {...}` table with its knob. No Spark: the series are simulated a bucket at a time through
load.add_batch, as the runtime's heartbeat writes them."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from airflow_plugin.core.autoscale.decide import (
    Direction,
    Recommendation,
    Rescale,
    ScalingSeen,
    StateSeen,
    decide,
)
from airflow_plugin.core.autoscale.load import BUCKET_S, KEEP_S, add_batch, add_idle, covered, figures, window
from airflow_plugin.core.autoscale.policy import (
    DYNAMIC_CONF,
    EXECUTOR_CORES_CONF,
    EXECUTORS_CONF,
    Autoscale,
    Knob,
    Mode,
    Partitions,
    parse_autoscale,
    size_of,
    sized,
    slots_per_unit,
)
from airflow_plugin.core.errors import InvalidInput

T0 = 1_700_000_000  # a bucket boundary: the series start here
WHERE = "jobs.toml job 'clicks':"


def simulate(
    arrivals: Sequence[float], rate: float, *, batches: int = 2, kafka: bool = True, backlog: float = 0.0
) -> list[dict[str, Any]]:
    """The load a job whose processing rate is `rate` rows/s while busy reports when `arrivals[i]` rows/s arrive in
    its i-th bucket: `batches` batches a bucket, each reading what it can of the backlog and the new rows; the Kafka
    lag at a batch's end is what it left plus what arrived while it ran (None without Kafka)."""
    load: list[dict[str, Any]] = []
    for i, arrival in enumerate(arrivals):
        available = backlog + arrival * BUCKET_S
        rows = min(available, rate * BUCKET_S)
        backlog = available - rows
        for b in range(batches):
            busy = rows / batches / rate
            lag = round(backlog + arrival * busy) if kafka else None
            at = T0 + i * BUCKET_S + (b + 1) * BUCKET_S / batches - 0.5
            load = add_batch(load, at, round(rows / batches), round(busy * 1000), lag)
    return load


def bucket(t: int, rows: int, busy_ms: int, backlog: int | None, batches: int = 1) -> dict[str, Any]:
    return {"t": t, "batches": batches, "rows": rows, "busy_ms": busy_ms, "backlog": backlog}


def end_of(load: Sequence[dict[str, Any]]) -> float:
    return float(load[-1]["t"] + BUCKET_S)


def seen(
    load: list[dict[str, Any]],
    size: int,
    *,
    policy: Autoscale | None = None,
    now: float | None = None,
    knob: Knob = Knob.CORES,
    slots: int = 1,
    partitions: int | None = None,
    history: Sequence[Rescale] = (),
    held: bool = False,
) -> ScalingSeen:
    now = end_of(load) if now is None else now
    return ScalingSeen(
        policy=policy or Autoscale(max=8),
        knob=knob,
        size=size,
        slots_per_unit=slots,
        partitions=partitions,
        load=[b for b in load if b["t"] < now],  # what the heartbeat had written by `now`
        now=now,
        history=list(history),
        ineffective_held=held,
    )


def along(load: list[dict[str, Any]], size: int, first: float, **kw: Any) -> list[Recommendation]:
    """decide at every bucket's end from `first` to the series' end, as the reconcile loop would call it."""
    return [decide(seen(load, size, now=now, **kw)) for now in range(int(first), int(end_of(load)) + 1, BUCKET_S)]


# a job of 2 cores that processes 1000 rows/s while busy: 600 rows/s for 10 minutes, then twice as many for 5
RAMP = simulate([600] * 60 + [1200] * 30, 1000)


def sized_for(load: Sequence[dict[str, Any]], policy: Autoscale, size: int, now: float) -> int:
    """The size that runs the window's arrivals at the target and works its backlog off within catch_up."""
    f = figures(window(load, policy.window, now), policy.window)
    assert f.processing_rate
    needed = f.arrival_rate / policy.target_utilization + (f.backlog or 0) / policy.catch_up
    return math.ceil(size * needed / f.processing_rate)


# ---- the decision on recorded series -------------------------------------------------------------------------


def test_ramp_up_scales_up_to_the_arrivals_at_the_target_and_the_backlog_within_catch_up() -> None:
    policy = Autoscale(max=8)
    rec = decide(seen(RAMP, 2, policy=policy))
    assert rec.direction is Direction.UP and rec.acts
    f = rec.figures
    assert f["utilization"] == 1.0
    assert f["backlog_growth"] > 50_000  # 200 rows/s more than it reads, for 5 minutes
    assert 1150 <= f["arrival_rate"] <= 1210  # the doubled arrivals, read off the rows and the lag's growth
    assert rec.size == sized_for(RAMP, policy, 2, end_of(RAMP)) == 4
    assert rec.current == 2 and "backlog grew" in rec.reason
    assert rec.partitions is None  # no state partitions known
    # within max
    capped = decide(seen(RAMP, 2, policy=Autoscale(max=3)))
    assert (capped.direction, capped.size) == (Direction.UP, 3)


def test_every_decision_records_the_state_it_saw_and_a_scale_up_on_a_skewed_state_says_so() -> None:
    even = StateSeen(rows=120_000, bytes=5 << 30, skew=1.1, snapshot="sp-1")
    rec = decide(replace(seen(RAMP, 2), state=even))
    assert rec.direction is Direction.UP, rec
    f = rec.figures
    assert (f["state_rows"], f["state_bytes"], f["state_skew"], f["state_of"]) == (120_000, 5 << 30, 1.1, "sp-1")
    assert "skewed" not in rec.reason and f["utilization"] == 1.0, "the load's figures kept"
    skewed = decide(replace(seen(RAMP, 2), state=replace(even, skew=3.5)))
    assert skewed.direction is Direction.UP and skewed.size == rec.size, "said, not decided on"
    assert "its state is skewed (the largest partition 3.5x the mean)" in skewed.reason, skewed.reason
    # a steady load's KEEP records the state too, and says nothing of its skew; no window read, nothing recorded
    steady = decide(replace(seen(simulate([500] * 60, 1000), 2), state=replace(even, skew=3.5)))
    assert steady.direction is Direction.KEEP and steady.figures["state_skew"] == 3.5 and "skew" not in steady.reason
    unknown = decide(replace(seen(RAMP[:2], 2), state=even))
    assert unknown.figures == {} and "judged on a whole one" in unknown.reason
    assert StateSeen(rows=7).to_dict() == {"state_rows": 7}


def test_the_ramp_is_not_acted_on_until_the_lag_has_grown_across_a_window_of_high_utilisation() -> None:
    recs = along(RAMP, 2, T0 + 300)
    first = next(i for i, r in enumerate(recs) if r.acts)
    assert all(r.direction is Direction.KEEP for r in recs[:first])
    # the ramp began at T0 + 600: the window's utilisation passes the target only well into it
    assert T0 + 300 + first * BUCKET_S > T0 + 600 + 60
    assert recs[first].direction is Direction.UP


def test_a_spike_shorter_than_the_window_is_never_acted_on() -> None:
    # 500 rows/s (utilisation 0.5), three times as many for 40 s, then back: the lag rises and is worked off
    load = simulate([500] * 40 + [1500] * 4 + [500] * 40, 1000)
    assert max(b["backlog"] for b in load) > 15_000
    recs = along(load, 2, T0 + 300)
    assert len(recs) > 50
    assert [r for r in recs if r.direction is not Direction.KEEP] == []


def test_a_slow_decline_scales_down_after_the_longer_quiet_window_to_no_less_than_half_and_min() -> None:
    # 4 cores at 2000 rows/s, arrivals from 1300 rows/s falling to 100 over 25 minutes
    arrivals = [1300 - 1200 * i / 150 for i in range(150)]
    load = simulate(arrivals, 2000)
    policy = Autoscale(max=8, min=1)
    recs = along(load, 4, T0 + 300, policy=policy)
    assert not any(r.direction is Direction.UP for r in recs)
    first = next(i for i, r in enumerate(recs) if r.acts)
    now = T0 + 300 + first * BUCKET_S
    assert now - T0 >= policy.scale_down_window  # never on less than the longer window
    down = recs[first]
    assert down.direction is Direction.DOWN and down.current == 4
    assert down.size >= max(policy.min, 2)  # at least half the size, and min
    assert down.partitions is None
    # at the end the arrivals would fit one core: half the size is the floor
    last = decide(seen(load, 4, policy=policy))
    assert (last.direction, last.size) == (Direction.DOWN, 2)
    assert "under 0.5 for 900 s" in last.reason
    # all but idle for 15 minutes: halved, not straight to what the arrivals need (1)
    idle = simulate([100] * 100, 2000)
    assert decide(seen(idle, 4, policy=policy)).size == 2
    assert decide(seen(idle, 2, policy=policy)).size == 1
    # and min above half
    assert decide(seen(load, 4, policy=Autoscale(max=8, min=3))).size == 3
    assert decide(seen(load, 3, policy=Autoscale(max=8, min=3))).direction is Direction.KEEP


def test_a_deployment_that_never_ran_a_batch_is_measured_idle_and_scaled_down() -> None:
    # rescaled to 4 in the evening, then no record all night: its query never ran a batch, only Spark's idle events
    # (a trigger that found no data, every 10 s); without them its load would be empty, never "a whole window"
    policy = Autoscale(max=8, min=1)
    load: list[dict[str, Any]] = []
    for i in range(int(policy.scale_down_window // BUCKET_S) + 1):
        load = add_idle(load, T0 + i * BUCKET_S + 3)
    assert all(b["batches"] == 0 for b in load) and covered(load, T0, end_of(load)) == end_of(load) - T0
    rec = decide(seen(load, 4, policy=policy))
    assert (rec.direction, rec.size) == (Direction.DOWN, 2), rec
    assert rec.figures["utilization"] == 0 and rec.figures["batches"] == 0
    assert decide(seen([], 4, policy=policy, now=end_of(load))).direction is Direction.KEEP  # nothing heard: unmeasured
    # an idle event within a bucket that holds batches adds nothing
    busy = add_batch([], T0 + 1, 100, 500, 7)
    assert add_idle(busy, T0 + 4) == busy and add_idle(busy, T0 + 4) is not busy


def test_working_off_a_backlog_at_full_utilisation_is_not_a_scale_up() -> None:
    # after an outage: 100k records behind, read back to back at 1000 rows/s while 800 arrive: the lag falls
    load = simulate([800] * 40, 1000, backlog=100_000)
    rec = decide(seen(load, 2))
    assert rec.figures["utilization"] == 1.0 and rec.figures["backlog_growth"] < 0
    assert rec.direction is Direction.KEEP and "keeps up" in rec.reason


def test_a_lag_growing_at_low_utilisation_is_not_a_scale_up() -> None:
    # reads capped (maxOffsetsPerTrigger): 500 rows/s in half the time while 600 arrive, 270k behind and growing;
    # more cores would not read more
    load = [bucket(T0 + i * BUCKET_S, 5000, 5000, 270_000 + 1000 * i, 2) for i in range(40)]
    rec = decide(seen(load, 2))
    assert rec.figures["utilization"] == pytest.approx(0.5) and rec.figures["backlog_growth"] > 0
    assert rec.direction is Direction.KEEP
    assert "reads are capped" in rec.reason and "maxOffsetsPerTrigger" in rec.reason, "the person is told why"


def test_a_quiet_job_whose_lag_jitters_around_its_floor_is_scaled_down() -> None:
    # utilisation 0.2 for 15 minutes, the lag moving by less than a bucket's arrivals (20 rows/s): at its floor
    rng = random.Random(7)
    load = [bucket(T0 + i * BUCKET_S, 200, 2000, 50 + rng.randrange(0, 150), 2) for i in range(90)]
    rec = decide(seen(load, 4))
    assert rec.direction is Direction.DOWN and rec.size == 2, rec


def test_a_window_read_mid_bucket_counts_the_time_its_buckets_stand_for() -> None:
    # busy all the time, read 5 s into the newest bucket: 1.0, not the 0.98 of dividing by the whole window
    load = [bucket(T0 + i * BUCKET_S, 1000, BUCKET_S * 1000, 1000 * i) for i in range(40)]
    now = T0 + 39 * BUCKET_S + 5
    rec = decide(seen(load, 2, now=now))
    assert rec.figures["utilization"] == 1.0 and rec.figures["seconds"] == pytest.approx(295)


def test_a_quiet_job_whose_backlog_is_above_its_floor_is_not_scaled_down() -> None:
    # utilisation 0.2 for 15 minutes, and the lag rising in the last minute (a source that sped up): not yet
    lags = [50] * 84 + [50 + 400 * i for i in range(6)]
    load = [bucket(T0 + i * BUCKET_S, 200, 2000, lag, 2) for i, lag in enumerate(lags)]
    rec = decide(seen(load, 4))
    assert rec.direction is Direction.KEEP and rec.figures["utilization"] == pytest.approx(0.2)
    # the same quiet with the lag back at its floor scales down
    flat = [bucket(T0 + i * BUCKET_S, 200, 2000, 50, 2) for i in range(90)]
    assert decide(seen(flat, 4)).direction is Direction.DOWN


def test_a_steady_load_at_the_target_never_acts() -> None:
    rng = random.Random(54)
    arrivals = [700 * (1 + rng.uniform(-0.1, 0.1)) for _ in range(180)]  # 0.7 of 1000 rows/s, jittered
    load = simulate(arrivals, 1000)
    recs = along(load, 2, T0 + 300)
    assert len(recs) == 151
    assert [r.describe() for r in recs if r.direction is not Direction.KEEP] == []
    assert all(0.6 < r.figures["utilization"] < 0.8 for r in recs)


def scaled_up(at: float, before_rate: float, **kw: Any) -> Rescale:
    return Rescale(
        at=at,
        from_size=2,
        to_size=4,
        reason="behind",
        figures={"processing_rate": before_rate, "utilization": 1.0},
        upgrade="u-1",
        outcome="DONE",
        seconds=90.0,
        **kw,
    )


def test_an_ineffective_scale_up_is_held() -> None:
    # scaled 2 -> 4 at 1000 rows/s, and the new deployment still does 1000 rows/s while behind: a bottleneck
    load = simulate([1200] * 40, 1000)
    history = [scaled_up(T0 - 60, 1000.0)]
    rec = decide(seen(load, 4, history=history))
    assert rec.direction is Direction.HOLD and not rec.acts
    assert rec.effective is False
    assert rec.size == rec.current == 4
    assert "did not raise the processing rate" in rec.reason
    # once recorded (the rescale judged, the hold kept): still held, not judged again
    judged = replace(history[0], effective=False)
    again = decide(seen(load, 4, history=[judged], held=True))
    assert again.direction is Direction.HOLD and again.effective is None


def test_an_effective_scale_up_is_not_held() -> None:
    # the rate nearly doubled (1000 -> 1900 rows/s) and the arrivals grew past it again: scaled up once more
    load = simulate([2400] * 40, 1900)
    rec = decide(seen(load, 4, history=[scaled_up(T0 - 60, 1000.0)]))
    assert rec.effective is True
    assert rec.direction is Direction.UP and rec.size > 4


def test_cooldown_after_a_rescale_keeps() -> None:
    now = end_of(RAMP)
    history = [scaled_up(now - 120, 1000.0)]
    rec = decide(seen(RAMP, 2, history=history))
    assert rec.direction is Direction.KEEP and "cooldown" in rec.reason
    # past the cooldown the same load scales
    assert decide(seen(RAMP, 2, history=[replace(history[0], at=now - 301, effective=True)])).acts


def test_a_window_not_yet_covered_keeps() -> None:
    young = [b for b in RAMP if b["t"] >= end_of(RAMP) - 200]  # a deployment 200 s old, behind
    rec = decide(seen(young, 2))
    assert rec.direction is Direction.KEEP and "covers 200 s of the 300 s window" in rec.reason


def test_at_max_and_behind_keeps_and_says_behind_at_max() -> None:
    rec = decide(seen(RAMP, 2, policy=Autoscale(max=2, min=1)))
    assert rec.direction is Direction.KEEP
    assert rec.behind_at_max is True and rec.to_dict()["behind_at_max"] is True
    assert "autoscale.max 2" in rec.reason
    # the budget spent changes neither
    now = end_of(RAMP)
    spent = [replace(scaled_up(now - t, 1000.0), effective=True) for t in (3000, 2000)]
    rec = decide(seen(RAMP, 2, policy=Autoscale(max=2, min=1), history=spent))
    assert rec.behind_at_max is True and "autoscale.max 2" in rec.reason


def test_the_hourly_budget_spent_keeps_and_says_so() -> None:
    now = end_of(RAMP)
    spent = [replace(scaled_up(now - t, 1000.0), effective=True) for t in (3000, 2000)]
    rec = decide(seen(RAMP, 2, history=spent))
    assert rec.direction is Direction.KEEP and rec.size == 2
    assert "would scale up to 4" in rec.reason and "max_rescales_per_hour (2)" in rec.reason
    # an hour on, one of them no longer counts
    older = [replace(r, at=r.at - 700) for r in spent]
    assert decide(seen(RAMP, 2, history=older)).direction is Direction.UP
    assert decide(seen(RAMP, 2, history=spent, policy=Autoscale(max=8, max_rescales_per_hour=3))).acts


def test_a_rescale_that_does_not_pay_for_its_restart_keeps() -> None:
    # utilisation about 0.8, a burst at the window's end: the lag grows past its noise, but 2 cores work it off in
    # a hundred seconds, sooner than through a 600 s rescale
    load = simulate([800] * 30 + [1200] * 6, 1000)
    slow = decide(seen(load, 2, policy=Autoscale(max=8, restart_time=600)))
    assert slow.direction is Direction.KEEP
    assert "would not pay" in slow.reason and "600 s rescale" in slow.reason
    assert slow.figures["utilization"] > 0.7 and slow.figures["backlog_growth"] > 0
    # a measured restart overrides restart_time
    measured = [replace(scaled_up(end_of(load) - 2000, 1000.0), seconds=1.0, effective=True)]
    assert decide(seen(load, 2, policy=Autoscale(max=8, restart_time=600), history=measured)).acts
    assert decide(seen(load, 2, policy=Autoscale(max=8, restart_time=1))).direction is Direction.UP


def test_without_a_backlog_figure_batches_back_to_back_scale_up_and_a_busy_job_does_not() -> None:
    behind = simulate([1200] * 40, 1000, kafka=False)
    rec = decide(seen(behind, 2))
    assert rec.figures["backlog"] is None
    assert rec.direction is Direction.UP and "back to back" in rec.reason
    busy = simulate([800] * 40, 1000, kafka=False)
    rec = decide(seen(busy, 2))
    assert rec.direction is Direction.KEEP and 0.75 < rec.figures["utilization"] < 0.85


def test_partitions_follow_a_scale_up_past_them_and_stay_otherwise() -> None:
    load = simulate([1500] * 40, 1000)  # 2 cores, behind: 6 wanted
    follow = decide(seen(load, 2, partitions=3))
    assert (follow.direction, follow.size, follow.partitions) == (Direction.UP, 6, 6)
    assert follow.to_dict()["partitions"] == 6
    # executors of 2 cores: the slots double
    execs = decide(seen(load, 2, knob=Knob.EXECUTORS, slots=2, partitions=3))
    assert (execs.size, execs.partitions) == (6, 12)
    # enough partitions already
    assert decide(seen(load, 2, partitions=200)).partitions is None
    fixed = decide(seen(load, 2, partitions=3, policy=Autoscale(max=8, partitions=Partitions.FIXED)))
    assert fixed.partitions is None
    assert (fixed.direction, fixed.size) == (Direction.UP, 3)  # fixed: a size is capped at the partitions
    # at the partitions already, and fixed: behind at the most it may have
    capped = decide(seen(load, 3, partitions=3, policy=Autoscale(max=8, partitions=Partitions.FIXED)))
    assert capped.direction is Direction.KEEP and capped.behind_at_max
    assert "at the state's 3 partitions (autoscale.partitions = fixed)" in capped.reason
    # a scale-down never shrinks them
    quiet = simulate([100] * 100, 1000)
    down = decide(seen(quiet, 4, partitions=3))
    assert down.direction is Direction.DOWN and down.partitions is None


def test_decide_is_pure() -> None:
    s = seen(RAMP, 2, partitions=3)
    before = [dict(b) for b in s.load]
    assert decide(s) == decide(s)
    assert s.load == before


# ---- the load buckets and their figures ----------------------------------------------------------------------


def test_add_batch_sums_a_bucket_and_rolls_at_ten_seconds() -> None:
    load = add_batch([], T0 + 1.5, 100, 400, 7)
    load = add_batch(load, T0 + 9.9, 50, 100, 3)
    assert load == [{"t": T0, "batches": 2, "rows": 150, "busy_ms": 500, "backlog": 3}]
    load = add_batch(load, T0 + 10, 20, 30, None)
    assert [b["t"] for b in load] == [T0, T0 + 10]
    assert load[1] == {"t": T0 + 10, "batches": 1, "rows": 20, "busy_ms": 30, "backlog": None}
    # nothing negative is summed
    assert add_batch([], T0, -5, -1, 0)[0] | {} == {"t": T0, "batches": 1, "rows": 0, "busy_ms": 0, "backlog": 0}


def test_add_batch_drops_buckets_beyond_keep_s_and_leaves_its_input_alone() -> None:
    load = [{"t": T0 + i * BUCKET_S, "batches": 1, "rows": 1, "busy_ms": 1, "backlog": 0} for i in range(200)]
    given = [dict(b) for b in load]
    new = add_batch(load, T0 + 200 * BUCKET_S + 1, 5, 5, 0)
    assert load == given  # not mutated: the heartbeat's copy is written as it was
    assert new[-1]["t"] == T0 + 200 * BUCKET_S
    assert len(new) == KEEP_S // BUCKET_S
    assert all(new[-1]["t"] - b["t"] < KEEP_S for b in new)
    # adding to the newest bucket does not touch the caller's dict either
    again = add_batch(new, T0 + 200 * BUCKET_S + 2, 5, 5, 1)
    assert new[-1]["batches"] == 1 and again[-1]["batches"] == 2


def test_figures_of_a_window() -> None:
    buckets = [bucket(T0, 6000, 6000, 1000, 2), bucket(T0 + 10, 6000, 6000, 3000, 2)]
    f = figures(buckets, 20)
    assert (f.seconds, f.batches, f.rows) == (20, 4, 12000)
    assert f.utilization == pytest.approx(0.6)
    assert f.processing_rate == pytest.approx(1000)
    assert f.arrival_rate == pytest.approx((12000 + 2000) / 20)  # the rows read and the lag's growth
    assert (f.backlog, f.backlog_growth, f.backlog_floor) == (3000, 2000, 1000)
    assert f.to_dict()["utilization"] == 0.6


def test_figures_a_falling_backlog_is_not_counted_as_arrivals() -> None:
    falling = figures([bucket(T0, 5000, 5000, 4000), bucket(T0 + 10, 5000, 5000, 1000)], 20)
    assert falling.backlog_growth == -3000
    assert falling.arrival_rate == pytest.approx((10000 - 3000) / 20)
    assert falling.backlog_floor == 1000
    # never below nothing
    assert figures([bucket(T0, 10, 10, 9000), bucket(T0 + 10, 10, 10, 0)], 20).arrival_rate == 0


def test_figures_utilisation_caps_and_empty_windows() -> None:
    assert figures([bucket(T0, 10, 30_000, None)], 20).utilization == 1.0
    f = figures([bucket(T0, 0, 2000, None)], 20)
    assert f.processing_rate is None and f.backlog is None and f.backlog_growth is None
    empty = figures([], 300)
    assert (empty.utilization, empty.arrival_rate, empty.processing_rate, empty.batches) == (0, 0, None, 0)
    assert figures([bucket(T0, 10, 10, 5)], 0).seconds == BUCKET_S  # no window shorter than a bucket
    one = figures([bucket(T0, 10, 10, 5)], 10)
    assert (one.backlog_growth, one.backlog_floor) == (0, 5)


def test_window_and_covered() -> None:
    load = [bucket(T0 + i * BUCKET_S, 1, 1, 0) for i in range(10)]
    now = T0 + 100
    assert [b["t"] for b in window(load, 30, now)] == [T0 + 70, T0 + 80, T0 + 90]
    assert covered(load, now - 30, now) == 30
    assert covered(load, now - 300, now) == 100  # a deployment younger than the window
    assert covered([], now - 30, now) == 0


# ---- the jobs file's table -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "master", "names"),
    [
        ({}, "local[2]", "autoscale needs max"),
        ({"min": 2}, "local[2]", "autoscale needs max"),
        ({"max": 0}, "local[2]", "autoscale.max"),
        ({"max": "4"}, "local[2]", "autoscale.max"),
        ({"max": True}, "local[2]", "autoscale.max"),
        ({"max": 2, "min": 3}, "local[2]", "autoscale.min = 3"),
        ({"max": 4, "target_utilization": 0}, "local[2]", "autoscale.target_utilization"),
        ({"max": 4, "target_utilization": 1.5}, "local[2]", "autoscale.target_utilization"),
        ({"max": 4, "target_utilization": float("nan")}, "local[2]", "autoscale.target_utilization"),
        ({"max": 4, "boundary": 0.7}, "local[2]", "autoscale.boundary"),
        ({"max": 4, "target_utilization": 0.5, "boundary": 0.6}, "local[2]", "autoscale.boundary"),
        ({"max": 4, "colour": "blue"}, "local[2]", "colour"),
        ({"max": 4, "knob": "cores"}, "yarn", 'autoscale.knob = "cores"'),
        ({"max": 4, "knob": "memory"}, "local[2]", "autoscale.knob"),
        ({"max": 4}, "local[*]", "local[*]"),
        ({"max": 4, "window": "5 parsecs"}, "local[2]", "autoscale.window"),
        ({"max": 4, "cooldown": 0}, "local[2]", "autoscale.cooldown"),
        ({"max": 4, "catch_up": -5}, "local[2]", "autoscale.catch_up"),
        ({"max": 4, "window": "10m", "scale_down_window": "5m"}, "local[2]", "autoscale.scale_down_window"),
        ({"max": 4, "scale_down_window": "2h"}, "local[2]", "autoscale.scale_down_window"),
        ({"max": 4, "mode": "sometimes"}, "local[2]", "autoscale.mode"),
        ({"max": 4, "partitions": "some"}, "local[2]", "autoscale.partitions"),
        ({"max": 4, "max_rescales_per_hour": -1}, "local[2]", "autoscale.max_rescales_per_hour"),
        (4, "local[2]", "autoscale must be a table"),
    ],
)
def test_parse_refuses_naming_the_key(value: Any, master: str, names: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_autoscale(value, master, WHERE)
    message = str(refused.value)
    assert names in message and message.startswith(WHERE)


def test_parse_defaults_and_durations() -> None:
    assert parse_autoscale(None, "local[2]", WHERE) is None
    policy = parse_autoscale({"max": 4}, "local[2]", WHERE)
    assert policy == Autoscale(max=4)
    assert (policy.min, policy.mode, policy.knob, policy.partitions) == (1, Mode.ACTIVE, None, Partitions.FOLLOW)
    assert (policy.target_utilization, policy.boundary, policy.max_rescales_per_hour) == (0.7, 0.2, 2)
    assert (policy.window, policy.scale_down_window, policy.cooldown) == (300, 900, 300)
    given = parse_autoscale(
        {
            "max": 6,
            "min": 2,
            "mode": "passive",
            "knob": "executors",
            "target_utilization": 0.6,
            "boundary": 0,
            "window": "2 min",
            "scale_down_window": "30m",
            "cooldown": 90,
            "catch_up": "10m",
            "restart_time": "2m",
            "max_rescales_per_hour": 0,
            "partitions": "fixed",
        },
        "local[2]",
        WHERE,
    )
    assert given == Autoscale(
        max=6,
        min=2,
        mode=Mode.PASSIVE,
        knob=Knob.EXECUTORS,
        target_utilization=0.6,
        boundary=0.0,
        window=120,
        scale_down_window=1800,
        cooldown=90,
        catch_up=600,
        restart_time=120,
        max_rescales_per_hour=0,
        partitions=Partitions.FIXED,
    )


def test_knob_for_the_master() -> None:
    policy = Autoscale(max=4)
    assert policy.knob_for("local[2]") is Knob.CORES
    assert policy.knob_for("local[4,3]") is Knob.CORES
    assert policy.knob_for("yarn") is Knob.EXECUTORS
    assert policy.knob_for("spark://host:7077") is Knob.EXECUTORS
    assert Autoscale(max=4, knob=Knob.EXECUTORS).knob_for("local[2]") is Knob.EXECUTORS
    assert parse_autoscale({"max": 4}, "yarn", WHERE).knob_for("yarn") is Knob.EXECUTORS


def test_size_of_and_sized_local_cores() -> None:
    assert size_of(Knob.CORES, "local[3]", {}) == 3
    assert size_of(Knob.CORES, "local[4,2]", {}) == 4
    assert size_of(Knob.CORES, "local[*]", {}) == 1
    conf = {"spark.sql.shuffle.partitions": "3"}
    master, new = sized(Knob.CORES, 6, "local[4,2]", conf)
    assert master == "local[6,2]"  # the failures suffix kept
    assert new == conf and new is not conf
    assert sized(Knob.CORES, 2, "local[4]", {})[0] == "local[2]"
    assert slots_per_unit(Knob.CORES, {EXECUTOR_CORES_CONF: "4"}) == 1


def test_size_of_and_sized_executors() -> None:
    assert size_of(Knob.EXECUTORS, "yarn", {EXECUTORS_CONF: "3"}) == 3
    assert size_of(Knob.EXECUTORS, "yarn", {}) == 1
    conf = {DYNAMIC_CONF: "true", EXECUTORS_CONF: "2", EXECUTOR_CORES_CONF: "2", "spark.app.x": "y"}
    master, new = sized(Knob.EXECUTORS, 5, "yarn", conf)
    assert master == "yarn"
    assert new == {DYNAMIC_CONF: "false", EXECUTORS_CONF: "5", EXECUTOR_CORES_CONF: "2", "spark.app.x": "y"}
    assert conf[EXECUTORS_CONF] == "2" and conf[DYNAMIC_CONF] == "true"  # the declared confs untouched
    assert slots_per_unit(Knob.EXECUTORS, conf) == 2
    assert slots_per_unit(Knob.EXECUTORS, {}) == 1
