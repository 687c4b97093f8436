"""The autoscaler end to end (issue 54): a declared job on local Spark, cores as the knob, reading the session's Kafka
broker, sized by `savepoints apply` processes run one after another as the reconcile DAG runs them.

The job (devtools/autoscale_app.py) sleeps a few milliseconds per row in its reading stage, over a topic of 12
partitions, then counts events per user and one-minute window into the file sink: its capacity is its task slots
whatever else the machine runs. Its state has 2 partitions (spark.sql.shuffle.partitions), `partitions = "follow"`.

0. It starts at local[1] under a light feed with a passive autoscaler; the feed rises past what one core does: the
   loop records its recommendation to scale up, and launches nothing.
1. The jobs file makes the autoscaler active: the loop RESCALEs it up (an upgrade to v1 at the new size, the state
   repartitioned when the size passes its 2 partitions), the upgrade ends DONE; the feed falls back, and the new
   deployment, at local[N > 2], works the backlog off to its floor.
2. After the longer quiet window the loop rescales it down; the state keeps its partitions.
3. The reconcile record holds both rescales (sizes, outcomes, the figures each read) and the last recommendation.
4. After a flush, every (user, window) fed was written once, with exactly the events fed for it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.timestamps import epoch_of
from airflow_plugin.core.upgrades.record import Phase, Upgrades
from devtools.autoscale_job import (
    JOB,
    TOPIC_PARTITIONS,
    ApplyLoop,
    RateFeeder,
    caught_up,
    check_every_window_once,
    pinned_partitions,
    recommended,
    reconciled,
    rescale_ended,
    running_batches,
    status_of,
    write_jobs_file,
)
from devtools.kafka import EmbeddedKafka
from devtools.windowed import wait_for
from tests.support.jobs import kill_every_deployment

pytestmark = [pytest.mark.spark]

AUTOSCALE = {
    "min": 1,
    "max": 4,
    "window": 50,  # seconds: a scale-up reads 50 s of load (batches of about 13 s at one core)
    "scale_down_window": 50,
    "cooldown": 10,
    "catch_up": 10,  # the backlog worked off fast: a scale-up past the 2 partitions
    "restart_time": 30,
    "max_rescales_per_hour": 6,
}
LIGHT, HEAVY = 10.0, 80.0  # events a second: under what one core does, and past it (under what four do)


@pytest.mark.slow(seconds=480)
@pytest.mark.timeout(1800)  # bounds polled below; a loaded 2-core machine took 4 minutes a rescale
def test_a_declared_job_scales_up_catches_up_and_scales_down_counting_every_window_once(
    tmp_path: Path, kafka: EmbeddedKafka, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=TOPIC_PARTITIONS)
    passive = {**AUTOSCALE, "mode": "passive"}
    jobs = write_jobs_file(tmp_path, str(tmp_path / "store"), kafka.bootstrap, topic, autoscale=passive)
    ctx = Settings(jobs_file=str(jobs)).resolve().job(JOB)
    try:
        with RateFeeder(kafka, topic, rate=LIGHT) as feeder, ApplyLoop(jobs, log=tmp_path / "apply.log") as loop:
            wait_for(lambda: running_batches(ctx, 1), "the loop's first deployment to run", timeout=300)
            first, _ = status_of(ctx)
            assert first is not None and first.master == "local[1]", first

            # 0. passive: the feed rises past one core, the loop recommends a scale-up and records it, nothing more
            feeder.rate = HEAVY
            wait_for(lambda: recommended(ctx) == "up", "a recommendation to scale up", timeout=300)
            record = reconciled(ctx)
            assert record.rescales == [] and "RESCALE" not in loop.actions(), record
            assert record.recommendation is not None and record.recommendation["current"] == 1, record
            assert record.recommendation["figures"]["backlog_growth"] > 0, record.recommendation
            assert [d.id for d in ctx.deployments.list(JOB)] == [first.id], "nothing launched"
            assert Upgrades(ctx.store.storage).list(JOB) == [], "no upgrade begun"

            # 1. active: scaled up through an upgrade that ends DONE; the feed falls back once it has, and the job
            # works its backlog off at the new size (however fast this machine's cores are today)
            write_jobs_file(tmp_path, str(tmp_path / "store"), kafka.bootstrap, topic, autoscale=AUTOSCALE)
            wait_for(rescale_ended(ctx, 1), "a scale-up to end", timeout=600)
            feeder.rate = LIGHT
            wait_for(lambda: caught_up(ctx), "the backlog back at its floor", timeout=600)
            feeder.check()
            ups = reconciled(ctx).rescales
            assert ups and all(r.to_size > r.from_size and r.outcome == str(Phase.DONE) for r in ups), ups
            assert ups[0].from_size == 1 and ups[0].figures["utilization"] > 0.7, ups[0]
            assert ups[0].figures["backlog_growth"] > 0, ups[0].figures
            top = ups[-1]
            upgrade = Upgrades(ctx.store.storage).get(JOB, str(top.upgrade))
            assert (upgrade.size, upgrade.from_size) == (top.to_size, top.from_size), upgrade
            scaled, _ = status_of(ctx)
            assert scaled is not None and scaled.id == upgrade.new_deployment, (scaled, upgrade)
            assert scaled.master == f"local[{top.to_size}]", scaled.master
            # past the state's 2 partitions: repartitioned to the new task slots, as the checkpoint pins them
            assert top.to_size > 2, ups
            past = next(r for r in ups if r.to_size > 2)
            assert past.partitions == past.to_size, past
            assert scaled.spark_conf["spark.sql.shuffle.partitions"] == str(past.to_size), scaled.spark_conf
            assert pinned_partitions(ctx, scaled.checkpoint) == past.to_size

            # 2. the feed stays light: scaled down after the longer quiet window, the partitions kept
            wait_for(lambda: len(reconciled(ctx).rescales) > len(ups), "a scale-down to begin", timeout=400)
            wait_for(rescale_ended(ctx, len(ups) + 1), "the scale-down to end", timeout=480)
            feeder.check()
            down = reconciled(ctx).rescales[len(ups)]
            assert (down.from_size, down.outcome) == (top.to_size, str(Phase.DONE)), down
            assert 1 <= down.to_size < top.to_size and down.partitions is None, down
            cut = epoch_of(str(upgrade.cutover_at))
            assert down.at - cut >= AUTOSCALE["scale_down_window"], "judged on a whole quiet window of its own"
            smaller, _ = status_of(ctx)
            assert smaller is not None and smaller.master == f"local[{down.to_size}]", smaller
            wait_for(lambda: running_batches(ctx, 1), "the smaller size's batches", timeout=60)
            assert pinned_partitions(ctx, smaller.checkpoint) == past.to_size

            # 3. the reconcile record: every rescale, the last recommendation with its figures
            record = reconciled(ctx)
            assert [(r.from_size, r.to_size) for r in record.rescales[: len(ups) + 1]] == [
                *((r.from_size, r.to_size) for r in ups),
                (top.to_size, down.to_size),
            ]
            assert record.recommendation is not None and "utilization" in record.recommendation["figures"], record
            # the apply that carried the scale-down out wrote its outcome before it ended: its run is kept once it has
            rescaled = len(ups) + 1
            wait_for(lambda: loop.carried_out("RESCALE") >= rescaled, "the scale-down's apply to end", timeout=120)
            assert loop.carried_out("RESCALE") == rescaled, loop.actions()
        assert all(run.returncode == 0 for run in loop.runs), [run.output for run in loop.runs if run.returncode]

        # 4. every (user, window) once, with the events fed for it
        check_every_window_once(feeder, tmp_path / "output", timeout=240)
    finally:
        kill_every_deployment(ctx)
