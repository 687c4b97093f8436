"""A savepoint of the Kafka job's checkpoint against `aws s3 sync` of the same checkpoint, in one run, on one
moto S3 server.

    uv run python -m bench.kafka_bench [--batches N]      (`make bench`, after bench.snapshot_bench)

1. The example Kafka job (spark_jobs/jobs/kafka_counts: dedup and windowed counts, two RocksDB stateful
   operators with changelog checkpointing) runs as a managed deployment with 200 shuffle partitions (400
   state stores) on a real broker, fed continuously, until it has committed N batches (default 100:
   Spark's default minBatchesToRetain, so the checkpoint holds as much history as a long-running job's);
   then it is stopped. The stopped checkpoint is kept under .bench/ and reused by an identical recipe.
2. Peer: `aws s3 sync` of the whole checkpoint into a fresh prefix.
3. The engine: a snapshot of the checkpoint into a fresh store (what `savepoints stop --savepoint` takes).
Both are repeated (interleaved) and the best time of each counts. Prints the table with the ratio and
writes it to .bench/kafka.json. Exit code 0 even when the target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from airflow_plugin.core.errors import SavepointsError
from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
from airflow_plugin.core.jobs.stop import kill, stop
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import S3Storage, open_storage
from bench.report import Results, Target, log, report
from bench.snapshot_bench import BENCH_DIR, Sample, best, last_commit, mb, run_tool, s3_server, tree_stats, venv_tool
from devtools.feeding import BackgroundFeeder
from devtools.kafka import EmbeddedKafka
from devtools.kafka_job import JOB, PARTITIONS, KafkaFeeder, write_jobs_file
from devtools.windowed import wait_for

BASE = BENCH_DIR / "kafka-checkpoint"  # built once, then reused
RECIPE = BENCH_DIR / "kafka-checkpoint.json"
RESULTS = BENCH_DIR / "kafka.json"
BUCKET = "bench-kafka"
SHUFFLE_PARTITIONS = 200
DEFAULT_BATCHES = 100
EVENTS_PER_ROUND = 400
REPEATS = 2
TARGET = 0.1  # snapshot time / aws s3 sync time


def recipe(batches: int) -> dict[str, Any]:
    return {"job": JOB, "shuffle_partitions": SHUFFLE_PARTITIONS, "batches": batches, "events": EVENTS_PER_ROUND}


def build_checkpoint(batches: int) -> float:
    """Run the Kafka job until it has committed `batches` batches, stop it, keep its checkpoint in BASE."""
    work = BENCH_DIR / "kafka-build"
    shutil.rmtree(work, ignore_errors=True)
    started = time.monotonic()
    with EmbeddedKafka() as kafka:
        topic = f"events-{uuid.uuid4().hex[:8]}"
        kafka.create_topic(topic, PARTITIONS)
        jobs = write_jobs_file(work, str(work / "store"), kafka.bootstrap, topic, shuffle_partitions=SHUFFLE_PARTITIONS)
        job = Settings(jobs_file=str(jobs)).resolve().job(JOB)
        feeder = KafkaFeeder(kafka, topic, EVENTS_PER_ROUND)
        with BackgroundFeeder(feeder, interval=1.0):
            try:
                checkpoint = Path(deploy(job, DeployRequest("v1", wait_seconds=600)).checkpoint)
                seen = [-1]

                def committed() -> bool:
                    if (batch := last_commit(checkpoint)) // 10 > seen[0] // 10:
                        log(f"batch {batch} of {batches - 1} committed")
                    seen[0] = batch
                    return batch >= batches - 1

                wait_for(committed, f"{batches} batches", timeout=batches * 120)
                stop(job, timeout=600)
            except BaseException:  # Ctrl-C included: no driver left behind
                with contextlib.suppress(SavepointsError):
                    kill(job)
                raise
    shutil.rmtree(BASE, ignore_errors=True)
    shutil.copytree(checkpoint, BASE)  # copy2 keeps mtimes
    shutil.rmtree(work, ignore_errors=True)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.kafka_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=DEFAULT_BATCHES, help="batches the job commits first")
    args = parser.parse_args(argv)
    results = Results()
    try:
        if json.loads(RECIPE.read_text()) != recipe(args.batches):
            raise ValueError("another recipe")
        log(f"REUSING the Kafka job's checkpoint in {BASE} (delete it to rebuild)")
        build_s = 0.0
    except (OSError, ValueError):
        log(f"running the Kafka job at {SHUFFLE_PARTITIONS} shuffle partitions for {args.batches} batches (once)")
        RECIPE.unlink(missing_ok=True)
        build_s = build_checkpoint(args.batches)
        RECIPE.write_text(json.dumps(recipe(args.batches)))
    files, size = tree_stats(BASE)
    how = f"built in {build_s:.0f} s" if build_s else "REUSED from an earlier run"
    results.row("checkpoint", "job", f"{JOB} v1: dedup + windowed count, RocksDB + changelog, {how}")
    shape = f"{SHUFFLE_PARTITIONS} shuffle partitions x 2 operators, batches 0..{last_commit(BASE)}"
    results.row("checkpoint", "shape", shape)
    results.row("checkpoint", "whole checkpoint", f"{files} files, {mb(size)} MB")

    with s3_server() as server:
        os.environ.update(server.env)  # the engine's boto3 client reads AWS_ENDPOINT_URL and the credentials
        server.create_bucket(BUCKET)
        peers: list[Sample] = []
        ours: list[Sample] = []
        manifest = None
        for rep in range(REPEATS):
            sync = [venv_tool("aws"), "--endpoint-url", server.endpoint, "s3", "sync", str(BASE)]
            sync += [f"s3://{BUCKET}/peer-{rep}/", "--only-show-errors", "--no-progress"]
            log(f"peer: aws s3 sync of the whole checkpoint ({rep + 1}/{REPEATS})")
            with server.phase() as usage:
                seconds = run_tool(sync, server.env, "aws s3 sync")
            peers.append(Sample(seconds, usage))
            log(f"engine: snapshot into a fresh store ({rep + 1}/{REPEATS})")
            store = SnapshotStore(open_storage(f"s3://{BUCKET}/store-{rep}"))
            with server.phase() as usage:
                started = time.monotonic()
                manifest = create_snapshot(store, open_storage(str(BASE)), SnapshotRequest(job=JOB))
                seconds = time.monotonic() - started
            ours.append(Sample(seconds, usage))
            synced = sum(1 for _ in S3Storage(BUCKET, f"peer-{rep}").list())
            if synced != files:
                raise RuntimeError(f"aws s3 sync copied {synced} objects of the checkpoint's {files} files")
    assert manifest is not None
    peer, engine = best(peers), best(ours)
    ratio = engine.seconds / peer.seconds
    synced = f"{peer.seconds:.2f} s ({files} files)  {peer.usage.describe(peer.seconds, files)}"
    results.row("peer", "aws s3 sync", synced)
    results.row(
        "engine",
        "snapshot",
        f"{engine.seconds:.2f} s: batch {manifest.batch_id}, {len(manifest.files)} files, "
        f"{mb(manifest.total_bytes)} MB  {engine.usage.describe(engine.seconds, len(manifest.files))}",
    )
    results.row("engine", "snapshot / aws s3 sync", f"{ratio:.3f}x (files {len(manifest.files) / files:.3f}x)")
    results.targets.append(
        Target("Kafka savepoint / aws s3 sync", ratio, TARGET, "x", f"{engine.seconds:.2f} s vs {peer.seconds:.2f} s")
    )
    results.data = {
        "checkpoint": {"files": files, "bytes": size, "last_batch": last_commit(BASE), "build_s": round(build_s)},
        "aws_s3_sync_s": [round(s.seconds, 3) for s in peers],
        "snapshot_s": [round(s.seconds, 3) for s in ours],
        "snapshot_files": len(manifest.files),
        "snapshot_bytes": manifest.total_bytes,
        "ratio": round(ratio, 4),
    }
    report(results, RESULTS)


if __name__ == "__main__":
    main()
