"""A managed job whose checkpoints live on S3 (checkpoint_root = "s3a://...") and whose sink is a Delta
table on S3, on the embedded S3 server: its drivers reach S3 through Hadoop's S3A with the settings the
engine derives from the store's S3 (no key in any Spark conf), and the engine snapshots and restores those
checkpoints through boto3. Deploy v1, a live savepoint while it runs, stop-with-savepoint, the pre-flight
of v2 on a throwaway copy on S3, v2 restored from the savepoint into a new s3a:// location and rescaled
there from 3 to 4 state partitions (Spark's offline repartition through S3A); once v2 committed batches to
the table, a restore of the savepoint behind the table is refused, and at the end every event is counted
exactly once, by v1 and the rescaled v2. Deep verify compares the live savepoint's state with the running
original on s3a:// through Spark. (The same stack through Airflow, with a blocked pre-flight and the rollback
that rewinds the table with Delta's RESTORE: test_dags_e2e.)"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_plugin.core.errors import Refused, SavepointsError
from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
from airflow_plugin.core.jobs.savepoint import take_savepoint
from airflow_plugin.core.jobs.stop import kill, stop
from airflow_plugin.core.layout import BLOBS
from airflow_plugin.core.sinks import DELTA
from airflow_plugin.core.sinks import delta as delta_sink
from airflow_plugin.core.snapshots.blobs import PackSettings
from airflow_plugin.core.snapshots.restore import plan_restore
from airflow_plugin.core.snapshots.verify import verify_snapshot
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.upgrades.preflight import preflight
from devtools import jvm
from devtools.windowed import SMALL_DELTA_TABLE, Feeder, batches, processed, wait_for, write_jobs_file
from spark_jobs.jobs.windowed.output import read_table, summarize

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_a_job_checkpointing_to_s3a_is_savepointed_restored_and_counts_every_event_once(
    tmp_path: Path, s3_server: Any, s3_store: str
) -> None:
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    root, output = f"s3a://{bucket}/checkpoints", f"s3a://{bucket}/output"
    jars = ",".join(str(jvm.link(group) / "*.jar") for group in ("s3a", "delta"))  # what `make setup` links
    jobs_file = write_jobs_file(
        tmp_path,
        s3_store,
        checkpoint_root=root,
        sink_args=("--sink", "delta", "--output", output),
        conf={"spark.jars": jars, **delta_sink.SESSION_CONF, **SMALL_DELTA_TABLE},
    )
    job = Settings(jobs_file=str(jobs_file)).resolve().job("windowed")
    table = open_storage(f"s3://{bucket}/output")
    assert "spark.hadoop.fs.s3a.endpoint" in job.spark_conf()
    assert not any("secret" in key or "access.key" in key for key in job.spark_conf()), "keys stay in the env"
    job.store.blobs.init_format(PackSettings(threshold=1000))  # the offsets files (1 KB): each its own object
    copies: Counter[str] = Counter()
    job.store.storage.client.meta.events.register("before-call.s3.CopyObject", lambda **_: copies.update(["copy"]))
    feeder = Feeder(tmp_path / "input", events_per_round=200)
    try:
        v1 = deploy(job, DeployRequest("v1"))
        assert v1.checkpoint.startswith(f"{root}/windowed/")
        for _ in range(2):
            feeder.round()
        wait_for(lambda: processed(v1.checkpoint, feeder.rounds), "v1 to process 2 rounds on s3a")

        feeder.round()  # batches keep running while the live savepoint copies
        live = take_savepoint(job)
        own_objects = {entry.key for entry in live.files if entry.key.startswith(BLOBS)}
        # S3A wrote them with a SHA-256 (the engine's conf): one CopyObject each, none through the engine
        assert own_objects and copies["copy"] == len(own_objects), (len(own_objects), copies)
        deep = verify_snapshot(job.store, "windowed", live.id, deep=True, spark_conf=job.spark_conf()).deep
        assert deep is not None and deep["operators"] and not deep["problems"], deep
        assert all(op.get("matches_original") for op in deep["operators"]), deep["operators"]
        stopped = stop(job, savepoint=True).snapshot
        assert stopped is not None and stopped.batch_id is not None and live.batch_id is not None
        assert stopped.batch_id >= live.batch_id
        for manifest in (live, stopped):
            assert verify_snapshot(job.store, "windowed", manifest.id).ok
            paths = [entry.path for entry in manifest.files]
            assert not [p for p in paths if p.endswith("/") or p.endswith(".tmp")], "markers or temp files copied"

        assert preflight(job, stopped.id, "v2").passed  # on a throwaway copy on S3 (v3's block: test_dags_e2e)

        [sink] = stopped.sinks
        assert sink["kind"] == DELTA and sink["location"] == output, stopped.sinks
        assert sink["version"] == max(delta_sink.commit_keys(table)), "the table as the stop left it"

        v2 = deploy(job, DeployRequest("v2", restore=stopped.id, partitions=4))
        assert v2.checkpoint.startswith(f"{root}/windowed/") and v2.restored_from == stopped.id
        assert batches(v2.checkpoint, "commits")[-1] >= stopped.batch_id  # the restore wrote to S3
        feeder.round()
        wait_for(lambda: processed(v2.checkpoint, feeder.rounds), "v2 to process a round on s3a")
        first_own = min(b for b in batches(v2.checkpoint, "offsets") if b > stopped.batch_id + 1)
        assert first_own == stopped.batch_id + 2, "N+1 is the repartition's own batch"
        latest = batches(v2.checkpoint, "commits")[-1]
        pinned = json.loads(open_storage(v2.checkpoint).read(f"offsets/{latest}").decode().splitlines()[1])["conf"]
        assert pinned["spark.sql.shuffle.partitions"] == "4", "v2 runs with the rescaled state"
        assert delta_sink.last_batch(table, stopped.query_id or "", None) > stopped.batch_id, "v2 wrote the table"

        # the table is ahead of the savepoint: a restore would let Delta skip v2's batches (the rollback that
        # rewinds it with Delta's RESTORE on S3A: test_dags_e2e, through the upgrade DAG)
        with pytest.raises(Refused, match=rf"Delta table {output} holds batches .*--rewind-sink"):
            plan_restore(job.store, "windowed", stopped.id, job.open(f"{root}/probe"), open_location=job.open)
        feeder.round()
        feeder.flush()
        wait_for(lambda: processed(v2.checkpoint, feeder.rounds), "v2 to process everything")
        wait_for(lambda: summarize(read_table(table)).events >= feeder.events, "the last windows in the table")
        stop(job)
    finally:
        for deployment in job.deployments.list("windowed"):
            with contextlib.suppress(SavepointsError):
                kill(job, deployment.id)
    summary = summarize(read_table(table))
    assert summary.events == feeder.events, "every event counted exactly once"
    assert summary.duplicates == []
    assert set(summary.versions) == {"v1", "v2"}, summary.versions
    assert not (tmp_path / "checkpoints").exists(), "no checkpoint went to local disk"
    assert list(open_storage(f"s3://{bucket}/checkpoints").list()), "the checkpoints are on S3"
