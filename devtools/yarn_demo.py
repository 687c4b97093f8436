"""The job on YARN (`make demo-yarn`): the example windowed job deployed to Hadoop's mini cluster (HDFS and YARN in
one JVM on 127.0.0.1, devtools/hadoop.py) in YARN cluster mode, its checkpoints on the mini HDFS, its snapshot store
on an embedded S3 server (moto), its Python environment shipped as an archive (devtools/driver_env.py):

deploy v1 -> a live savepoint while it commits batches -> the upgrade to v2 (stop/restore, its pre-flight a YARN
application too) -> every event counted once -> `savepoints kill` through YARN's ResourceManager -> the status,
FAILED with YARN's word for it.

Prints each step and check; exits non-zero if a check fails. The cluster and the S3 server are stopped at the end,
whatever happened (and with them the drivers YARN runs). Work files: .demo-yarn/ (deleted at the start)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from airflow_plugin.cli import main as savepoints
from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
from airflow_plugin.core.jobs.savepoint import take_savepoint
from airflow_plugin.core.storage import HdfsStorage
from devtools.driver_env import ARCHIVE, pack
from devtools.embedded_s3 import EmbeddedS3
from devtools.hadoop import MiniHadoop
from devtools.java import require_java
from devtools.windowed import Feeder, feeding_version, processed, wait_for, wait_output_complete
from devtools.yarn_job import write_yarn_jobs_file
from spark_jobs.jobs.windowed.output import read_output, summarize

WORK = Path(".demo-yarn").absolute()


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def check(ok: bool, text: str) -> bool:
    print(f"   [{'ok' if ok else 'FAILED'}] {text}", flush=True)
    return ok


def run(hadoop: MiniHadoop, s3: EmbeddedS3) -> bool:
    step(f"mini cluster up: HDFS {hadoop.hdfs_uri}, YARN {hadoop.rm_url}; packing the drivers' Python environment")
    envs = HdfsStorage(hadoop.hdfs_uri.removeprefix("hdfs://"), "/envs", [hadoop.webhdfs_address])
    envs.upload(pack(WORK / "env"), ARCHIVE)
    s3.create_bucket("demo")
    jobs = write_yarn_jobs_file(WORK, "s3://demo/savepoints", hadoop, f"{envs.uri}/{ARCHIVE}", s3.env())
    job = Settings(jobs_file=str(jobs)).resolve().job("windowed")
    feed, results = Feeder(WORK / "input"), []

    step("deploy v1 in YARN cluster mode (spark-submit returns once YARN accepted it)")
    v1 = deploy(job, DeployRequest("v1"))
    app = hadoop.application(v1.launcher["app_id"])
    results.append(check(app["state"] == "RUNNING", f"{app['id']} RUNNING, checkpoint {v1.checkpoint}"))

    step("a live savepoint while the job commits batches")
    feed.round()
    wait_for(lambda: processed(v1.checkpoint, feed.rounds), "v1's first round")
    for _ in range(3):
        feed.round()
    live = take_savepoint(job)
    results.append(check(live.batch_id is not None, f"savepoint {live.id} at batch {live.batch_id}"))

    step("upgrade to v2: pre-flight, pre-started driver, stop-with-savepoint, restore into HDFS, health gate")
    wait_for(lambda: processed(v1.checkpoint, feed.rounds), "v1 to catch up")
    started = time.monotonic()
    with feeding_version(job, feed, "v2"):  # the new version's health gate counts its new batches
        upgraded = savepoints(["upgrade", "windowed", "--version", "v2", "--mode", "stop_restore", "--jobs", str(jobs)])
    results.append(check(upgraded == 0, f"upgraded in {time.monotonic() - started:.0f} s"))

    step("every event counted exactly once")
    feed.flush()
    wait_output_complete(WORK / "output", feed.events)
    summary = summarize(read_output(WORK / "output"))
    results.append(check(summary.events == feed.events and not summary.duplicates, f"{summary.events} events"))

    step("savepoints kill: through YARN's ResourceManager")
    results.append(check(savepoints(["kill", "windowed", "--jobs", str(jobs)]) == 0, "killed"))
    savepoints(["status", "windowed", "--jobs", str(jobs)])
    return all(results)


def main() -> int:
    require_java()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir()
    with EmbeddedS3() as s3, MiniHadoop() as hadoop:
        s3.apply_env()
        os.environ.update(hadoop.env())  # the engine and spark-submit talk to this cluster
        ok = run(hadoop, s3)
    print("\nall checks passed" if ok else "\nsome checks FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
