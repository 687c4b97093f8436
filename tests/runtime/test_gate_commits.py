"""The two drivers of an upgrade's cutover committing one Delta table on S3 at the same moment lose no commit
(spark_jobs/runtime/gate.py `commit_lock`). Delta's default S3 LogStore checks that log version N is absent, then PUTs
it: two JVMs that both check before either's PUT lands both write N, the second over the first. Here two Spark
drivers (gate_commit_app.py: one blue, one green, each its own JVM) append batches to one table on the embedded S3:
a failpoint lines them up before every commit (`before-commit-turn=meet:DIR`), and a proxy holds every log
version's PUT back for a while, so that without the lock both would check version N before either's lands, every
time. With the lock they take turns, and the log holds every batch of both queries. (With the lock made a no-op,
both wrote version 0, each with a table of its own, and the next batch failed on the log: DELTA_STATE_RECOVER_ERROR.)
Two JVMs start at once: 170 s measured with the 2 cores loaded 4-fold by other work."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from airflow_plugin.core.storage import open_storage
from devtools.embedded_s3 import EmbeddedS3
from devtools.faulty_s3 import FaultyS3
from spark_jobs.runtime.failpoints import ENV as FAILPOINTS
from spark_jobs.runtime.gate import BLUE, COMMIT_LOCK, GREEN

pytestmark = [pytest.mark.spark, pytest.mark.slow(seconds=120)]

REPO = Path(__file__).resolve().parents[2]
APP = Path(__file__).with_name("gate_commit_app.py")
BATCHES = 2
HELD = 2.0  # seconds each log version's PUT is held back: longer than the two drivers' commits are apart
COMMIT = re.compile(r"_delta_log/(\d{20})\.json$")


def start_driver(table: str, role: str, tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    command = [sys.executable, str(APP), table, role, str(BATCHES), str(tmp_path / role)]
    with (tmp_path / f"{role}.log").open("wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)


@pytest.mark.timeout(300)
def test_two_drivers_committing_one_s3_table_at_once_lose_no_commit(s3_server: EmbeddedS3, tmp_path: Path) -> None:
    bucket = f"lake-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    table = f"s3a://{bucket}/output"
    with FaultyS3(s3_server.endpoint, latency=HELD) as proxy:
        proxy.force_matching("PUT", ".json", "latency")  # the log's versions (data files are .parquet)
        env = {**os.environ, **proxy.env(), FAILPOINTS: f"before-commit-turn=meet:{tmp_path / 'meet'}"}
        drivers = {role: start_driver(table, role, tmp_path, env) for role in (BLUE, GREEN)}
        try:
            for driver in drivers.values():
                driver.wait(timeout=240)
        finally:
            for driver in drivers.values():
                driver.kill()  # its JVM ends with it (pyspark's gateway watches its parent's stdin)
    said = {role: (tmp_path / f"{role}.log").read_text(errors="replace") for role in drivers}
    for role, driver in drivers.items():
        assert driver.returncode == 0, f"{role}:\n{said[role][-4000:]}"
    queries = {role: re.findall(r"^query (\S+)$", said[role], re.MULTILINE)[-1] for role in drivers}

    storage = open_storage(table)
    written: dict[str, list[int]] = {}
    versions = []
    for info in storage.list("_delta_log/"):
        if match := COMMIT.search(info.key):
            versions.append(int(match[1]))
            for line in storage.read(info.key).decode().splitlines():
                action = json.loads(line)
                if "txn" in action:
                    written.setdefault(action["txn"]["appId"], []).append(int(action["txn"]["version"]))
    assert sorted(versions) == list(range(2 * BATCHES)), "one version per batch of each driver, none written twice"
    assert {role: sorted(written.get(query, [])) for role, query in queries.items()} == {
        role: list(range(BATCHES)) for role in drivers
    }, "every batch of both queries is in the log"
    assert storage.stat(COMMIT_LOCK) is None, "the last turn was released"
