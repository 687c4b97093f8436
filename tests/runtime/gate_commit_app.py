"""One of the two drivers of an upgrade's cutover, as far as their writes go: a Spark driver of its own (a JVM of its
own, Delta and S3A on its classpath) whose gated writer (spark_jobs/runtime/gate.py) appends `--batches` batches to
one Delta table, as blue or green: what test_gate_commits.py runs twice at once.

    python tests/runtime/gate_commit_app.py TABLE ROLE BATCHES CHECKPOINT"""

from __future__ import annotations

import json
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow_plugin.core.storage import S3Settings
from devtools.jvm import spark_conf
from devtools.spark import local_spark
from spark_jobs.runtime.gate import BLUE, DeltaTarget, GatedWriter, GateState

ROWS = 20  # per batch
START = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMA = "writer string, batch long, window_end timestamp"


def main(table: str, role: str, batches: int, checkpoint: Path) -> None:
    started = time.monotonic()
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))  # the query id: Delta's txn appId
    spark = local_spark(
        f"gate-commit-{role}",
        1,
        **{"spark.master": "local[1]", "spark.driver.memory": "512m"},
        **spark_conf(["s3a", "delta"]),
        **S3Settings().spark_conf(),  # the endpoint of AWS_ENDPOINT_URL, as a launched driver has it
    )
    # blue writes the windows ending at or before its T, green those after: here every row is on its side
    gate = GateState("window_end", role, until=2**62) if role == BLUE else GateState("window_end", role, after=0)
    writer = GatedWriter(
        spark,
        DeltaTarget(table),
        gate,
        str(checkpoint),
        lambda state: None,
        lambda request, answer: None,
        lambda upgrade: None,
        holder=role,
    )
    for batch_id in range(batches):
        ends = [START + timedelta(minutes=batch_id * ROWS + i) for i in range(ROWS)]
        rows = spark.createDataFrame([(role, batch_id, end) for end in ends], SCHEMA)
        writer(rows, batch_id)
        print(f"batch {batch_id} written at {time.monotonic() - started:.1f}s", flush=True)
    print(f"query {writer.query_id}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
