"""The autoscaler on the reconcile loop, without Spark: the plan's RESCALE (and its passive and held forms), the size
every other step of the loop keeps, and what `apply` reads and records in a store (a deployment's master and load,
the recommendation, a rescale's end). The decision itself: test_autoscale.py; end to end: tests/e2e."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from airflow_plugin.core.autoscale.decide import Rescale, ScalingSeen
from airflow_plugin.core.autoscale.load import BUCKET_S
from airflow_plugin.core.autoscale.policy import Autoscale, Knob, Mode
from airflow_plugin.core.errors import InvalidInput
from airflow_plugin.core.jobs.context import JobContext, Settings
from airflow_plugin.core.jobs.deploy import submit_spec
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.jobs.spec import Desired, RestartPolicy, load_jobs
from airflow_plugin.core.reconcile import record as records
from airflow_plugin.core.reconcile.apply import (
    KEPT_RESCALES,
    _record_rescale,
    apply_job,
    declared_status,
    loop_context,
    next_step,
    retry,
    upgrade_ended,
)
from airflow_plugin.core.reconcile.plan import Action, Observed, Seen, plan
from airflow_plugin.core.reconcile.record import Reconciled
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.timestamps import utc_stamp
from airflow_plugin.core.upgrades.record import Phase, Upgrade
from tests.support.jobs import write_jobs
from tests.support.synthetic import ROCKSDB, write_checkpoint

NOW = 1_800_000_000.0
POLICY = Autoscale(max=4, window=60, scale_down_window=120, cooldown=60, restart_time=1)


def behind(now: float, seconds: float = 120, rows: int = 1000, backlog_step: int = 500) -> list[dict[str, Any]]:
    """A load that cannot keep up: batches back to back, the Kafka backlog growing every bucket."""
    start = int((now - seconds) // BUCKET_S * BUCKET_S)  # buckets start at multiples of their length
    return [
        {
            "t": t,
            "batches": 1,
            "rows": rows,
            "busy_ms": BUCKET_S * 1000,
            "backlog": (t - start) // BUCKET_S * backlog_step,
        }
        for t in range(start, int(now), BUCKET_S)
    ]


def quiet(now: float, seconds: float = 300) -> list[dict[str, Any]]:
    start = int((now - seconds) // BUCKET_S * BUCKET_S)
    return [{"t": t, "batches": 1, "rows": 10, "busy_ms": 500, "backlog": 0} for t in range(start, int(now), BUCKET_S)]


def scaling(load: list[dict[str, Any]], *, mode: Mode = Mode.ACTIVE, size: int = 1, **more: Any) -> ScalingSeen:
    policy = Autoscale(**{**POLICY.__dict__, "mode": mode})
    return ScalingSeen(policy, Knob.CORES, size, 1, 2, load, NOW, **more)


def observed(deployment: Seen | None, scaling_seen: ScalingSeen | None = None, **more: Any) -> Observed:
    return Observed(
        job="orders",
        desired=more.pop("desired", Desired(version="v1", upgrade_mode="stop_restore")),
        restart=RestartPolicy(attempts=3, delay=0),
        fingerprint="f1",
        now=NOW,
        deployment=deployment,
        record=more.pop("record", Reconciled("orders")),
        scaling=scaling_seen,
    )


def running(size: int = 1, version: str = "v1") -> Seen:
    return Seen(id="dp-1", version=version, state=State.RUNNING, updated_at=NOW, last_batch_id=9, size=size)


# ---------------------------------------------------------------------------------------------------- the plan


def test_a_job_that_falls_behind_is_rescaled_through_an_upgrade_of_its_running_version() -> None:
    step = plan(observed(running(), scaling(behind(NOW))))
    assert step.action is Action.RESCALE and step.action.acts, step
    assert (step.version, step.mode, step.from_size) == ("v1", "stop_restore", 1)
    assert step.size is not None and 1 < step.size <= 4
    assert step.partitions == (step.size if step.size > 2 else None), "past its 2 partitions: repartitioned"
    assert step.recommendation is not None and step.recommendation.figures["backlog_growth"] > 0
    assert "up from 1 to" in step.reason


def test_a_passive_autoscaler_recommends_and_records_without_acting() -> None:
    step = plan(observed(running(), scaling(behind(NOW), mode=Mode.PASSIVE)))
    assert step.action is Action.NOTHING and not step.action.acts
    assert step.recommendation is not None and step.recommendation.acts
    assert "passive, not acted on" in step.reason and "up from 1 to" in step.reason


def test_a_job_that_keeps_up_is_left_alone_and_a_quiet_one_scaled_down() -> None:
    kept = plan(observed(running(size=2), scaling(quiet(NOW, 50), size=2)))
    assert kept.action is Action.NOTHING and "judged on a whole one" in kept.reason, kept.reason
    down = plan(observed(running(size=4), scaling(quiet(NOW), size=4)))
    assert (down.action, down.size, down.from_size, down.partitions) == (Action.RESCALE, 2, 4, None), down


def test_no_rescale_before_an_upgrade_to_the_desired_version_nor_while_one_runs() -> None:
    other = plan(observed(running(version="v1"), scaling(behind(NOW)), desired=Desired(version="v2")))
    assert other.action is Action.UPGRADE and other.size is None, "its steps keep the old deployment's size"
    held = Reconciled("orders", paused_by="ann")
    assert plan(observed(running(), scaling(behind(NOW)), record=held)).action is Action.PAUSED


def test_every_other_step_of_the_loop_keeps_the_size_the_job_runs_at() -> None:
    failed = Seen(id="dp-1", version="v1", state=State.FAILED, updated_at=NOW - 100, size=3)
    assert plan(observed(failed)).size == 3, "a restart at the failed deployment's size"
    stopped = Seen(id="dp-1", version="v1", state=State.STOPPED, updated_at=NOW - 100, size=3)
    step = plan(observed(stopped))
    assert (step.action, step.size) == (Action.DEPLOY, 3), "a redeploy after a stop at the stopped one's size"
    first = plan(observed(None))
    assert (first.action, first.size) == (Action.DEPLOY, None), "a first start at the declared size"


# ------------------------------------------------------------------------------- the jobs file and the knob


def test_the_knob_is_the_local_masters_cores_or_a_clusters_executors(tmp_path: Path) -> None:
    extra = 'spark_master = "local[1]"\ndesired = { version = "v1" }\nautoscale = { max = 4 }'
    spec = load_jobs(str(write_jobs(tmp_path, extra=extra)))["orders"]
    assert spec.autoscale is not None and spec.sized(3).spark_master == "local[3]"
    assert spec.size_of("local[3]", {}) == 3 and spec.size_of(None, {}) == 1, "no master recorded: the declared one"
    yarn = 'spark_master = "yarn"\ndesired = { version = "v1" }\nautoscale = { max = 6 }'
    on_yarn = load_jobs(str(write_jobs(tmp_path / "yarn", extra=yarn)))["orders"]
    sized = on_yarn.sized(5)
    assert sized.spark_master == "yarn" and sized.conf["spark.executor.instances"] == "5"
    assert (
        sized.conf["spark.dynamicAllocation.enabled"] == "false" and sized.conf["spark.sql.shuffle.partitions"] == "3"
    )
    assert on_yarn.size_of("yarn", sized.conf) == 5
    with pytest.raises(InvalidInput, match=r"autoscale sizes a job the reconcile loop keeps running: add desired"):
        load_jobs(str(write_jobs(tmp_path / "no-desired", extra="autoscale = { max = 2 }")))


def test_a_launch_at_a_size_submits_that_master_and_records_it(tmp_path: Path) -> None:
    job = _declare(tmp_path)
    at_three = job.at_size(3)
    version = at_three.spec.version("v1")
    assert submit_spec(at_three, version, "dp-x", "cp", {}).master == "local[3]"
    assert submit_spec(job, version, "dp-x", "cp", {}).master == "local[1]"
    assert job.at_size(None) is job


# ------------------------------------------------------------------------------------- apply, a store, no driver


_EXTRA = (
    'spark_master = "local[1]"\ndesired = {{ version = "v1", upgrade_mode = "stop_restore" }}\n'
    'autoscale = {{ max = {max}, window = "60s", scale_down_window = "120s", cooldown = "60s", mode = "{mode}" }}'
)


def _declare(tmp_path: Path, mode: str = "active") -> JobContext:
    extra = _EXTRA.format(mode=mode, max=4)
    return Settings(jobs_file=str(write_jobs(tmp_path, extra=extra))).resolve().job("orders")


def _running(
    job: JobContext, load: list[dict[str, Any]], master: str = "local[1]", provider: str | None = ROCKSDB
) -> Deployment:
    deployments = Deployments(job.store.storage)
    checkpoint = write_checkpoint(Path(job.spec.checkpoint_root) / "cp", 3, provider=provider)
    deployment = Deployment("dp-20260101T000000000Z-0001", "orders", "v1", str(checkpoint), master=master)
    deployment.spark_conf = {"spark.sql.shuffle.partitions": "2"}
    deployments.put(deployment)
    deployments.write_status("orders", deployment.id, DeploymentStatus(State.RUNNING, time.time(), load=load))
    return deployment


def test_apply_reads_the_running_deployments_size_and_load_and_records_a_passive_recommendation(
    tmp_path: Path,
) -> None:
    job = _declare(tmp_path, mode="passive")
    _running(job, behind(time.time()), master="local[2]")
    step = next_step(job)
    assert step.action is Action.NOTHING and step.recommendation is not None, step
    assert step.recommendation.current == 2, "its size read from the master it was launched with"
    applied = apply_job(job)
    assert applied.ok and applied.step.action is Action.NOTHING
    kept = records.read(job.store.storage, "orders")
    assert kept.recommendation is not None and kept.recommendation["direction"] == "up"
    # busy all the time (a later bucket the load has not reached yet may count: the clock ran on since it was made)
    assert kept.recommendation["figures"]["utilization"] > 0.9
    assert "state_bytes" not in kept.recommendation["figures"], "no snapshot of this deployment yet"
    status = declared_status(job)
    assert status is not None and status["autoscale"]["mode"] == "passive"
    assert status["autoscale"]["recommendation"]["size"] == step.recommendation.size
    assert kept.rescales == [] and len(Deployments(job.store.storage).list("orders")) == 1, "nothing launched"


def test_the_recommendation_records_the_state_its_heartbeat_and_its_newest_snapshot_show(tmp_path: Path) -> None:
    """The state's rows from the heartbeat (summed over its operators), its bytes and skew from the deployment's
    newest snapshot: here partition 1 holds most of the bytes."""
    job = _declare(tmp_path, mode="passive")
    deployment = _running(job, behind(time.time()))
    checkpoint = Path(deployment.checkpoint)
    (checkpoint / "state/0/1/3.delta").write_bytes(b"x" * 4000)  # partition 1's newest version: most of the state
    operators = [{"name": "dedupe", "rows": 300}, {"name": "window", "rows": 40}]
    status = DeploymentStatus(State.RUNNING, time.time(), load=behind(time.time()), state_operators=operators)
    Deployments(job.store.storage).write_status("orders", deployment.id, status)
    older = create_snapshot(job.store, open_storage(str(checkpoint)), SnapshotRequest(job="orders"))  # no deployment
    own = create_snapshot(job.store, open_storage(str(checkpoint)), SnapshotRequest("orders", deployment=deployment.id))
    assert older.state and own.state
    assert apply_job(job).ok
    figures = records.read(job.store.storage, "orders").recommendation["figures"]
    [stats] = own.state
    assert figures["state_rows"] == 340 and figures["state_of"] == own.id, figures
    assert figures["state_bytes"] == stats["bytes"] and figures["state_bytes"] > 4000, (figures, stats)
    assert figures["state_skew"] == stats["skew"]["ratio"] and figures["state_skew"] > 1.4, (figures, stats)


def test_a_state_spark_cannot_repartition_caps_the_size_at_its_partitions_before_anything_stops(
    tmp_path: Path,
) -> None:
    job = _declare(tmp_path)
    _running(job, behind(time.time()), master="local[2]", provider=None)  # Spark's default, HDFS-backed state
    step = next_step(job)
    assert step.action is Action.NOTHING and step.recommendation is not None, step
    assert step.recommendation.behind_at_max and "a state Spark cannot repartition" in step.reason, step.reason
    _running(job, behind(time.time()), master="local[2]")  # RocksDB: repartitioned on the way
    rescale = next_step(job)
    assert (rescale.action, rescale.partitions, rescale.mode) == (Action.RESCALE, rescale.size, "stop_restore")


def test_a_rescales_end_is_recorded_on_it_and_holds_no_version(tmp_path: Path) -> None:
    job = _declare(tmp_path)
    started = time.time() - 30
    record = Reconciled("orders", rescales=[Rescale(at=started - 0.5, from_size=1, to_size=3, reason="r", figures={})])
    records.write(job.store.storage, record)
    ended = Upgrade(id="up-1", job="orders", to_version="v1", size=3, from_size=1, mode="stop_restore")
    ended.created_at, ended.cutover_at, ended.phase = utc_stamp(started), utc_stamp(started + 12), Phase.DONE
    done = upgrade_ended(job, ended)
    assert done.ok and "rescale of v1 from 1 to 3" in done.outcome and "done" in done.outcome, done
    [rescale] = records.read(job.store.storage, "orders").rescales
    assert (rescale.upgrade, rescale.outcome) == ("up-1", "DONE") and rescale.seconds == pytest.approx(12, abs=0.01)

    ended.id, ended.phase, ended.error = "up-2", Phase.ROLLED_BACK, "unhealthy"
    records.write(job.store.storage, Reconciled("orders", rescales=[Rescale(started - 0.5, 1, 3, "r", {})]))
    failed = upgrade_ended(job, ended)
    assert not failed.ok and "keeps running at 1" in str(failed.error)
    kept = records.read(job.store.storage, "orders")
    assert kept.failed_versions == {}, "a rescale that failed holds no version: v1 is what runs"
    assert kept.rescales[-1].outcome == "ROLLED_BACK"


def test_a_held_scale_up_is_released_by_retry_or_a_change_of_the_jobs_file(tmp_path: Path) -> None:
    job = _declare(tmp_path)
    held = Reconciled("orders", scale_up_held="it did not help", scale_up_held_under=job.spec.fingerprint)
    records.write(job.store.storage, held)
    _running(job, behind(time.time()))
    assert declared_status(job)["autoscale"]["scale_up_held"] == "it did not help"  # type: ignore[index]
    assert next_step(job).recommendation.direction == "hold"  # type: ignore[union-attr]
    changed = Settings(jobs_file=str(write_jobs(tmp_path, extra=_EXTRA.format(mode="active", max=6))))
    other = changed.resolve().job("orders")
    assert declared_status(other)["autoscale"]["scale_up_held"] is None  # type: ignore[index]
    assert next_step(other).action is Action.RESCALE, "a new declaration tries again"
    retry(job)
    assert records.read(job.store.storage, "orders").scale_up_held is None


def test_a_rescale_is_counted_and_a_dry_runs_json_carries_the_recommendation(tmp_path: Path) -> None:
    job = _declare(tmp_path)
    _running(job, behind(time.time()))
    dry = apply_job(job, dry_run=True).to_dict()
    assert dry["action"] == "RESCALE" and dry["recommendation"]["direction"] == "up"
    assert dry["recommendation"]["figures"]["backlog_growth"] > 0
    record = Reconciled("orders", rescales=[Rescale(time.time() - 10_000, 1, 2, "r", {})] * KEPT_RESCALES)
    record.rescales_total = KEPT_RESCALES
    records.write(job.store.storage, record)
    assert _record_rescale(loop_context(job)) is not None
    kept = records.read(job.store.storage, "orders")
    assert (len(kept.rescales), kept.rescales_total) == (KEPT_RESCALES, KEPT_RESCALES + 1), "the list is capped"
    assert declared_status(job)["autoscale"]["rescales"] == KEPT_RESCALES + 1  # type: ignore[index]
