"""Problems a cold review found in the autoscaler's rescale and the S3 copy by ETag, each shown on the real code and
a real store (local disk, or the embedded S3), no Spark, and fixed: each test failed before its fix."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from airflow_plugin.core.autoscale.decide import Direction, ScalingSeen, decide
from airflow_plugin.core.autoscale.load import BUCKET_S
from airflow_plugin.core.autoscale.policy import Autoscale, Knob
from airflow_plugin.core.errors import CheckpointChanged, Refused
from airflow_plugin.core.jobs.deploy import repartition_conf, submit_spec
from airflow_plugin.core.jobs.spec import Desired, RestartPolicy, load_jobs
from airflow_plugin.core.layout import blob_key
from airflow_plugin.core.progress import NullProgress
from airflow_plugin.core.reconcile.plan import Action, Observed, Seen, plan
from airflow_plugin.core.records.deployment import Deployment, State
from airflow_plugin.core.snapshots.blobs import PackSettings
from airflow_plugin.core.snapshots.create import SnapshotRequest, _Copier, _Known, create_snapshot
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import S3Storage, open_storage
from airflow_plugin.core.upgrades.launch import _rescale_to
from tests.support.jobs import write_jobs
from tests.support.synthetic import ROCKSDB, write_checkpoint

# ------------------------------------------------------------------ the S3 copy by ETag trusts an unprobed condition


def test_a_file_replaced_between_its_hash_and_its_copy_is_never_stored_under_the_first_ones_checksum(
    s3_store: str,
) -> None:
    """On a server that keeps no checksum (the path S3Proxy takes: `copies_checksummed` False after the first
    staging copy) the engine hashes a file by ranged GETs pinned to its ETag, then copies it within S3 with
    CopySourceIfMatch, and relies on the server to refuse the copy of a newer version. A server that ignores
    that condition (the embedded S3, moto, does) copies the newer version, and the engine stores it under the
    checksum of the one it hashed: a COMPLETED snapshot whose blob is not what its manifest says. copy_from even
    returned the checksum of what it copied (moto computes one), and _hash_and_copy dropped it."""
    bucket = open_storage(s3_store)
    assert isinstance(bucket, S3Storage)
    store = SnapshotStore(bucket)
    store.blobs.init_format(PackSettings(threshold=0))  # every file its own blob: the copy path
    checkpoint = S3Storage(bucket.bucket, "checkpoints/orders", bucket.settings)
    first, newer = b"first" * 4000, b"newer" * 4000  # the same size: only the content changed
    checkpoint.write("state/0/0/9.zip", first)
    info = next(i for i in checkpoint.list("state/") if i.key == "state/0/0/9.zip")

    writer = store.blobs.writer()
    writer.copies_checksummed = False  # what the first staging copy on a checksum-less server taught this create
    copier = _Copier(checkpoint, _Known({}, {}), NullProgress(), writer)

    client = checkpoint.client
    replaced: list[str] = []

    def replace_on_copy(params: dict[str, Any], **_: Any) -> None:
        """A writer replaces the file right after it was hashed, just before the copy by its ETag is sent."""
        if "CopySourceIfMatch" in params and not replaced:
            replaced.append(params["CopySourceIfMatch"])
            bucket.client.put_object(Bucket=bucket.bucket, Key="checkpoints/orders/state/0/0/9.zip", Body=newer)

    client.meta.events.register("provide-client-params.s3.CopyObject", replace_on_copy)
    try:
        try:
            entry = copier(info)
        except CheckpointChanged:
            return  # what should happen: the attempt starts again at a newer batch
    finally:
        client.meta.events.unregister("provide-client-params.s3.CopyObject", replace_on_copy)
    assert replaced, "the copy by ETag was sent"
    stored = bucket.read(blob_key(entry.sha256))
    assert entry.sha256 == hashlib.sha256(first).hexdigest()
    assert hashlib.sha256(stored).hexdigest() == entry.sha256, (
        f"blob {blob_key(entry.sha256)} holds the newer version's bytes under the first one's checksum"
    )


# ------------------------------------------------------------- a rescale of HDFS-backed state stops the job first


def _behind(now: float, seconds: float = 120) -> list[dict[str, Any]]:
    start = int((now - seconds) // BUCKET_S * BUCKET_S)
    return [
        {"t": t, "batches": 1, "rows": 1000, "busy_ms": BUCKET_S * 1000, "backlog": (t - start) // BUCKET_S * 500}
        for t in range(start, int(now), BUCKET_S)
    ]


def test_a_rescale_that_spark_cannot_repartition_is_not_decided(tmp_path: Path) -> None:
    """docs/operations.md says HDFS-backed state 'is refused before anything changes'. The autoscaler decides
    a scale-up past the state's partitions without knowing the state's provider (decide.py `_partitions`), and
    the first check (`check_rescalable`, through launch.py `_rescale_to`) runs in `activate`: with
    stop_restore that is in steps.py `cutting_over`, after `stop(ctx, savepoint=True, ...)` stopped the old
    deployment. The refusal then rolls the job back (a second restart), twice an hour while it stays behind."""
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    checkpoint = write_checkpoint(tmp_path / "cp", batches=3, partitions=2)  # HDFS-backed state (no provider set)
    manifest = create_snapshot(store, open_storage(str(checkpoint)), SnapshotRequest(job="orders"))
    assert manifest.operators, "the snapshot holds state"

    now = 1_800_000_000.0
    policy = Autoscale(max=4, window=60, scale_down_window=120, cooldown=60, restart_time=1)
    seen = ScalingSeen(policy, Knob.CORES, 2, 1, 2, _behind(now), now)
    assert decide(seen).partitions, "RocksDB state (the default here): repartitioned past its partitions"
    with pytest.raises(Refused, match="which Spark's"):  # what the cutover would meet, once the job was stopped
        _rescale_to(manifest, 3)
    # apply.py scaling_seen reads the provider: state Spark cannot repartition caps the size at its partitions
    recommendation = decide(replace(seen, repartitionable=False))
    assert recommendation.partitions is None and recommendation.direction is Direction.KEEP, recommendation
    assert recommendation.behind_at_max and "a state Spark cannot repartition" in recommendation.reason


# --------------------------------------------------- a version's own conf overrides the size the autoscaler gives


def _version_sized_jobs(tmp_path: Path) -> Path:
    """A job on YARN with an autoscaler whose version declares its own executors."""
    (tmp_path / "job.py").touch()
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(
        """
[defaults]
store = "store"
checkpoint_root = "checkpoints"

[jobs.orders]
spark_master = "yarn"
desired = { version = "v1" }
autoscale = { max = 6 }
versions.v1 = { application = "job.py", conf = { "spark.executor.instances" = "2" } }
"""
    )
    return jobs


def test_a_rescaled_launch_runs_at_the_size_it_was_given(tmp_path: Path) -> None:
    """The executors knob is written into the job's conf (JobSpec.sized), and every launch composes its conf as
    {**job conf, **version conf, ...} (deploy.py `_deploy`, launch.py `launch_beside` and `_prestart`): a version
    that declares its own spark.executor.instances (or dynamic allocation) keeps it, whatever size the rescale
    asked for. The rescale ends DONE at the old size; the deployment's conf reads that size; the autoscaler
    rescales again, then judges its scale-up ineffective and holds scale-ups, blaming a bottleneck."""
    jobs = _version_sized_jobs(tmp_path)
    spec = load_jobs(str(jobs))["orders"]
    at_five = spec.sized(5)
    version = at_five.version("v1")
    conf = {**at_five.conf, **version.conf}  # what a launch at the new size records and submits (deploy.py:278)
    assert spec.size_of(at_five.spark_master, conf) == 5, f"launched at {spec.size_of(at_five.spark_master, conf)}"


def test_the_submitted_conf_is_the_deployments(tmp_path: Path) -> None:
    """(Support for the test above: submit_spec passes the deployment's conf through, so what the deployment
    records is what spark-submit is given.)"""
    jobs = _version_sized_jobs(tmp_path)
    from airflow_plugin.core.jobs.context import Settings

    job = Settings(jobs_file=str(jobs)).resolve().job("orders").at_size(5)
    version = job.spec.version("v1")
    submitted = submit_spec(job, version, "dp-x", "cp", {**job.spec.conf, **version.conf})
    assert submitted.conf["spark.executor.instances"] == "5", "the size over the version's own conf"


# ------------------------------------------ a rescale under load meets a savepoint that ends inside a batch


def _rocksdb_checkpoint(root: Path, *, pending: bool) -> Path:
    """A checkpoint of RocksDB state, its last batch logged without a commit when `pending`: what a live savepoint
    of a job whose batches run back to back holds."""
    return write_checkpoint(root, batches=3, partitions=2, pending=pending, provider=ROCKSDB)


def test_a_scale_up_past_the_partitions_is_not_refused_for_a_savepoint_taken_under_load(tmp_path: Path) -> None:
    """The autoscaler scales up a job whose batches run back to back (decide.py BACK_TO_BACK, a growing backlog).
    Its upgrade's live savepoint (steps.py `savepointing`: a plain snapshot of the running checkpoint) then almost
    always holds offsets N+1 without their commit, and launch.py `launch_beside` -> `_rescale_to` ->
    rescale.py `check_rescalable` refuses it: a blue/green rescale past the partitions aborts every time the job
    is loaded enough to be scaled up. stop_restore restores the stop savepoint instead, which the stop's race
    with the next trigger can leave inside a batch too: refused in `activate` after the old version stopped."""
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    idle = create_snapshot(
        store, open_storage(str(_rocksdb_checkpoint(tmp_path / "idle", pending=False))), SnapshotRequest(job="idle")
    )
    assert _rescale_to(idle, 3) == 3, "RocksDB state at a batch boundary: repartitioned"
    loaded = create_snapshot(
        store, open_storage(str(_rocksdb_checkpoint(tmp_path / "busy", pending=True))), SnapshotRequest(job="busy")
    )
    assert loaded.pending_batch_id == 3
    with pytest.raises(Refused, match="batch boundary"):
        _rescale_to(loaded, 3)
    # so a rescale that repartitions goes through a stop, whose savepoint is at a batch boundary, not blue/green
    now = 1_800_000_000.0
    policy = Autoscale(max=4, window=60, scale_down_window=120, cooldown=60, restart_time=1)
    running = Seen(id="dp-1", version="v1", state=State.RUNNING, updated_at=now, size=2)
    observed = Observed(
        job="busy",
        desired=Desired(version="v1", upgrade_mode="blue_green"),
        restart=RestartPolicy(),
        fingerprint="f",
        now=now,
        deployment=running,
        scaling=ScalingSeen(policy, Knob.CORES, 2, 1, 2, _behind(now), now),
    )
    step = plan(observed)
    assert (step.action, step.partitions, step.mode) == (Action.RESCALE, step.size, "stop_restore"), step
    unpartitioned = plan(replace(observed, scaling=ScalingSeen(policy, Knob.CORES, 2, 1, 200, _behind(now), now)))
    assert (unpartitioned.partitions, unpartitioned.mode) == (None, "blue_green"), "no repartition: as declared"


# ------------------------------------------- the repartition batch's sink log entry ignores the job's interval


def test_the_repartition_batch_is_logged_with_the_compaction_interval_the_job_declares(tmp_path: Path) -> None:
    """A job that declares `spark.sql.streaming.fileSink.log.compactInterval = 4` (jobs file conf) runs its file
    sink compacting at batches 3, 7, ... deploy.py `repartition_restored` passes `{**ctx.spark_conf(),
    **plan.spark_conf}` to `log_repartition_batch`: ctx.spark_conf() keeps only jars, S3A and Delta keys of the
    job's conf (context.py spark_conf), and the offset log's conf does not pin the sink's interval. The engine
    takes the default 10 and writes `_spark_metadata/3` where Spark reads `3.compact`: the failure commit b6bf199
    fixed (the rescaled query fails at every start at its next compaction), back for this job.
    (tests/core/test_rescale.py passes {SINK_COMPACT_CONF: "4"} to log_repartition_batch itself.)"""
    from airflow_plugin.core.jobs.context import Settings
    from airflow_plugin.core.jobs.rescale import SINK_COMPACT_CONF, log_repartition_batch
    from airflow_plugin.core.records.manifest import Kind, Manifest, SnapshotStatus, Trigger

    (tmp_path / "job.py").touch()
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(
        f"""
[defaults]
store = "store"
checkpoint_root = "checkpoints"

[jobs.orders]
conf = {{ "spark.sql.shuffle.partitions" = "2", "{SINK_COMPACT_CONF}" = "4" }}
versions.v1 = {{ application = "job.py" }}
"""
    )
    ctx = Settings(jobs_file=str(jobs)).resolve().job("orders")
    output = tmp_path / "out"
    (output / "_spark_metadata").mkdir(parents=True)
    for batch in range(3):  # batches 0..2 as Spark's file sink logs them, each adding one file
        (output / "_spark_metadata" / str(batch)).write_text(
            "v1\n" + json.dumps({"path": f"file:{output}/part-{batch}", "size": 1, "isDir": False, "action": "add"})
        )
    manifest = Manifest(
        "sp-1", "orders", Kind.SAVEPOINT, Trigger.MANUAL, SnapshotStatus.COMPLETED, "cp", "2026",
        sinks=[{"kind": "file", "location": str(output)}],
        spark_conf={"spark.sql.shuffle.partitions": "2"},
    )  # fmt: skip
    version = ctx.spec.version("v1")
    deployment = Deployment("dp-1", "orders", "v1", "cp", spark_conf={**ctx.spec.conf, **version.conf})
    conf = repartition_conf(ctx, deployment, manifest.spark_conf)  # what deploy.py repartition_restored passes
    logged = log_repartition_batch(manifest, 3, ctx.open, conf)
    assert logged == [f"{output}/_spark_metadata/3.compact"], logged


def test_a_repartition_of_a_cluster_jobs_state_runs_here_with_its_sql_confs_not_its_clusters_python(
    tmp_path: Path,
) -> None:
    """The repartition is a Spark tool of the deciding process (spark_app.py run_spark_tool): a YARN job's
    `spark.pyspark.python = ./environment/bin/python` (its shipped archive's, in a container) made that tool's
    spark-submit fail with `error=2, No such file or directory`, and every rescale of a YARN job past its
    partitions rolled back. It takes the job's confs (its jars, state store classes, driver memory), not where or
    with what the job runs."""
    from airflow_plugin.core.jobs.context import Settings
    from airflow_plugin.core.jobs.rescale import SINK_COMPACT_CONF

    (tmp_path / "job.py").touch()
    cluster = {
        "spark.pyspark.python": "./environment/bin/python",
        "spark.archives": "hdfs:///envs/env.tgz#environment",
        "spark.executor.instances": "2",
        "spark.yarn.maxAppAttempts": "1",
    }
    own = {SINK_COMPACT_CONF: "4", "spark.hadoop.dfs.replication": "1", "spark.jars": "/opt/state-store.jar"}
    confs = {**cluster, **own, "spark.driver.memory": "4g"}
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(
        f"""
[jobs.orders]
store = "store"
checkpoint_root = "hdfs://127.0.0.1:9000/checkpoints"
spark_master = "yarn"
deploy_mode = "cluster"
conf = {{ {", ".join(f'"{key}" = "{value}"' for key, value in confs.items())} }}
versions.v1 = {{ application = "job.py" }}
"""
    )
    ctx = Settings(jobs_file=str(jobs)).resolve().job("orders")
    deployment = Deployment("dp-1", "orders", "v1", "cp", spark_conf={**ctx.spec.conf, **ctx.spec.version("v1").conf})
    conf = repartition_conf(ctx, deployment, {"spark.sql.shuffle.partitions": "1"})
    assert {key: conf.get(key) for key in own} == own and conf["spark.driver.memory"] == "4g", conf
    assert conf["spark.sql.shuffle.partitions"] == "1", "what the checkpoint pins wins"
    assert not set(cluster) & set(conf), conf


# --------------------------- after an aborted blue/green rescale, latest-state skips the old deployment's progress


def test_latest_state_after_an_aborted_green_is_the_old_deployments_live_checkpoint(tmp_path: Path) -> None:
    """An aborted blue/green upgrade (a rescale of the loop's, now, at every abort) leaves its green's record, newest
    of the job's deployments, with its location emptied (steps.py `aborting`); the old deployment runs on and
    commits batches past every snapshot. Should it fail, the loop's RESTART (or a DEPLOY after a stop) restores
    latest-state: deploy.py `latest_state` reads only the newest deployment's checkpoint (`previous[-1]`), the
    green's, finds nothing, and falls back to the newest snapshot: older than what the old deployment committed.
    A file or Delta sink then refuses the restore (the sink is ahead) at every try; an unguarded sink takes the
    batches since that snapshot twice."""
    from airflow_plugin.core.jobs.context import Settings
    from airflow_plugin.core.jobs.deploy import latest_state
    from airflow_plugin.core.records.deployment import Deployment
    from tests.support.synthetic import add_batch

    ctx = Settings(jobs_file=str(write_jobs(tmp_path))).resolve().job("orders")
    old_cp = write_checkpoint(tmp_path / "checkpoints" / "orders" / "dp-1", batches=5, partitions=2)
    old = Deployment("dp-20260101T000000000Z-0001", "orders", "v1", str(old_cp))
    ctx.deployments.put(old)
    live_savepoint = create_snapshot(
        ctx.store, open_storage(str(old_cp)), SnapshotRequest(job="orders", deployment=old.id, job_version="v1")
    )
    assert live_savepoint.batch_id == 4
    green_cp = tmp_path / "checkpoints" / "orders" / "dp-2"  # aborted: its location emptied
    green = Deployment("dp-20260101T000100000Z-0002", "orders", "v1", str(green_cp), aborted_by="up-1")
    ctx.deployments.put(green)  # what steps.py `aborting` records of it
    for batch in range(5, 10):  # the old deployment runs on past the savepoint
        add_batch(old_cp, batch, partitions=2)

    latest = latest_state(ctx, ctx.deployments.list("orders"))
    assert latest.live is not None and latest.live[1] == 9, (
        f"latest-state is snapshot {latest.snapshot.id if latest.snapshot else None} at batch "
        f"{latest.snapshot.batch_id if latest.snapshot else None}, the old deployment committed batch 9"
    )
