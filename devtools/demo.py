"""The main job (`make demo`): a real stateful Spark query, snapshotted LIVE into S3 (an embedded moto
server), restored into a new checkpoint location and resumed there, with an exactly-once check of
the final result against the events fed. Prints what it does; exits non-zero if any check fails."""

from __future__ import annotations

import logging
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from airflow_plugin.core.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.manifest import Manifest, Trigger
from airflow_plugin.core.restore import execute_restore, plan_restore
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.store import SnapshotStore
from airflow_plugin.core.verify import verify_snapshot
from devtools.embedded_s3 import EmbeddedS3
from devtools.java import require_java
from devtools.spark import local_spark

JOB = "event_counts"
EVENTS_PER_ROUND = 500
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def step(text: str) -> None:
    console.print(f"\n[bold cyan]>>[/] {text}")


def check(ok: bool, text: str, failures: list[str]) -> None:
    console.print(f"   {'[green]PASS[/]' if ok else '[red]FAIL[/]'} {text}")
    if not ok:
        failures.append(text)


def snapshot_row(table: Table, label: str, m: Manifest) -> None:
    table.add_row(
        label,
        m.id,
        str(m.status),
        str(m.batch_id),
        str(len(m.files)),
        f"{m.total_bytes:,}",
        f"{m.uploaded_bytes:,}",
        f"{m.timings.get('total_s', 0):.2f}s",
    )


def main() -> int:
    require_java()
    logging.basicConfig(level=logging.WARNING)
    work = Path(".demo").absolute()
    shutil.rmtree(work, ignore_errors=True)
    inputs, original_out, restored_out = work / "input", work / "output-original", work / "output-restored"
    original_ckpt, restored_ckpt = work / "checkpoints/deployment-1", work / "checkpoints/deployment-2"
    failures: list[str] = []
    fed: list[dict[str, object]] = []
    started = time.monotonic()

    with EmbeddedS3() as s3:
        s3.apply_env()
        store_uri = s3.create_bucket("savepoints") + "/store"
        store = SnapshotStore(open_storage(store_uri))
        step(f"embedded S3 (moto server) at {s3.endpoint}; snapshot store {store_uri}")

        from spark_jobs.jobs.event_counts import final_counts, start, write_events

        spark = local_spark("savepoints-demo", shuffle_partitions=4)

        step(
            f"start {JOB}: count events per user, RocksDB state with changelog checkpointing, "
            f"exactly-once foreachBatch sink; checkpoint {original_ckpt}"
        )
        query = start(spark, inputs, original_out, str(original_ckpt), trigger_seconds=0.5)
        for round_no in range(4):
            fed += write_events(inputs, round_no, EVENTS_PER_ROUND)
        query.processAllAvailable()
        fed += write_events(inputs, 4, EVENTS_PER_ROUND)  # keeps the query busy during the snapshot

        step("take a LIVE savepoint while the query keeps running")
        live = create_snapshot(
            store,
            open_storage(str(original_ckpt)),
            SnapshotRequest(job=JOB, trigger=Trigger.MANUAL, requested_by="demo"),
        )
        console.print(f"   {live.id}: batch {live.batch_id}, {len(live.files)} files, {live.total_bytes:,} bytes")
        check(query.isActive, "the query kept running during the snapshot", failures)

        for round_no in range(5, 7):
            fed += write_events(inputs, round_no, EVENTS_PER_ROUND)
        query.processAllAvailable()
        query.stop()
        last_original_batch = query.lastProgress["batchId"]
        step(f"stopped the original query after batch {last_original_batch}; take a second savepoint (incremental)")
        stopped = create_snapshot(
            store, open_storage(str(original_ckpt)), SnapshotRequest(job=JOB, trigger=Trigger.STOP, requested_by="demo")
        )
        check(
            stopped.uploaded_bytes < stopped.total_bytes,
            f"second savepoint uploaded {stopped.uploaded_bytes:,} of {stopped.total_bytes:,} bytes "
            "(only files no earlier snapshot holds)",
            failures,
        )

        step(f"verify the live savepoint {live.id}")
        report = verify_snapshot(store, JOB, live.id)
        check(report.ok, f"{report.files} files match their checksums", failures)

        step(f"restore the live savepoint into a NEW location {restored_ckpt} and resume the query there")
        plan = plan_restore(store, JOB, live.id, open_storage(str(restored_ckpt)))
        execute_restore(store, plan)
        for key, value in sorted(plan.spark_conf.items()):
            if "rocksdb" in key or "providerClass" in key:
                console.print(f"   restored query runs with {key}={value}")
        resumed = start(spark, inputs, restored_out, str(restored_ckpt), trigger_seconds=0.5)
        for round_no in range(7, 9):
            fed += write_events(inputs, round_no, EVENTS_PER_ROUND)
        resumed.processAllAvailable()
        first_batch = resumed.recentProgress[0]["batchId"]
        last_batch = resumed.lastProgress["batchId"]
        resumed.stop()
        check(
            first_batch == live.batch_id + 1,
            f"the restored query resumed at batch {first_batch} (snapshot at {live.batch_id})",
            failures,
        )

        step(
            "exactly-once check: output up to the snapshot's batch from the original run, after it from "
            "the restored run, against the events fed"
        )
        expected = dict(sorted(Counter(str(e["user"]) for e in fed).items()))
        actual = final_counts(spark, (original_out, 0, live.batch_id), (restored_out, live.batch_id + 1, last_batch))
        check(
            actual == expected,
            f"{sum(actual.values())} of {len(fed)} events counted exactly once across {len(expected)} users",
            failures,
        )
        spark.stop()

        table = Table(title="snapshots", header_style="bold")
        for column in ("", "id", "status", "batch", "files", "bytes", "uploaded", "time"):
            table.add_column(column)
        snapshot_row(table, "live", live)
        snapshot_row(table, "after stop", stopped)
        console.print()
        console.print(table)
    console.print(
        f"\ndemo finished in {time.monotonic() - started:.0f}s: "
        + ("[green]all checks passed[/]" if not failures else f"[red]{len(failures)} check(s) failed[/]")
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
