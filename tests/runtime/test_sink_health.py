"""Whether a batch Spark counts no rows for wrote to its Delta sink, as the running driver's listener asks the
table's log (spark_jobs/runtime/status.py `sink_wrote`, core/sinks/delta.py `LogWatch`), on logs laid out as Delta
writes them (tests/core/test_delta_sink.py's helpers; Spark and Delta for real in tests/e2e/test_jvm_stack.py).

A commit of the query's batch made since the batch began: it wrote. One made before (an earlier run's, whose txn
makes Delta skip the batch), or none: it processed nothing. Told by the log's versions against what the driver saw
before the batch, so that other hosts' clocks do not decide; and read without listing the whole log each batch."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.records.deployment import DeploymentStatus, State
from airflow_plugin.core.storage import LocalStorage, ObjectInfo, open_storage
from spark_jobs.runtime import status as runtime_status
from spark_jobs.runtime.status import ProgressListener, StatusBoard, sink_wrote
from tests.core.test_delta_sink import write as delta_write

MINUTE_MS = 60_000


class CountingStorage(LocalStorage):
    """The table as the driver opens it, counting what a check lists and reads."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.listed: list[str] = []
        self.read_keys: list[str] = []

    def list(self, prefix: str = "", start_after: str = "") -> Iterator[ObjectInfo]:
        for info in super().list(prefix, start_after):
            self.listed.append(info.key)
            yield info

    def read(self, key: str) -> bytes:
        self.read_keys.append(key)
        return super().read(key)

    def reset(self) -> None:
        self.listed, self.read_keys = [], []


def now_ms() -> int:
    return int(time.time() * 1000)


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def progress(query: str, batch: int, began_ms: int) -> dict[str, Any]:
    """Spark's progress of a batch that read 10 Kafka records by its offsets and counted no input row."""
    start, end = {"events": {"0": batch * 10}}, {"events": {"0": batch * 10 + 10}}
    kafka = {"description": "KafkaV2[Subscribe[events]]", "startOffset": start, "endOffset": end}
    return {"id": query, "batchId": batch, "numInputRows": 0, "sources": [kafka], "timestamp": iso(began_ms)}


def listener_on(table: Path, store: Path) -> tuple[ProgressListener, Deployments]:
    deployments = Deployments(open_storage(str(store)))
    board = StatusBoard(deployments, "j", "d", DeploymentStatus(State.STARTING, time.time()))
    listener = ProgressListener(board)
    listener.sink = f"DeltaSink[{table}]"
    return listener, deployments


def test_a_batch_that_wrote_is_told_without_listing_the_whole_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's log of a thousand versions with a checkpoint at 990: the first check lists from the checkpoint on,
    every later one only the keys after the newest version it saw, and reads only the commits it needs."""
    path = tmp_path / "table"
    for version in range(1000):  # batches 0..999 of the query, as versions 0..999
        delta_write(path, version, "q", version, at_ms=1_000 + version)
    log = path / "_delta_log"
    (log / f"{990:020d}.checkpoint.parquet").write_bytes(b"PAR1")
    (log / "_last_checkpoint").write_text(json.dumps({"version": 990, "size": 1000}))
    table = CountingStorage(path)
    monkeypatch.setattr(runtime_status, "_table", lambda location: table)
    sink = f"DeltaSink[{path}]"

    began = now_ms()
    delta_write(path, 1000, "q", 1000, at_ms=began + 40)  # batch 1000 wrote, though Spark counted no row
    assert sink_wrote(sink, progress("q", 1000, began))
    assert len(table.listed) <= 15, f"listed {len(table.listed)} keys of the log: {table.listed[:3]}..."
    assert table.read_keys == ["_delta_log/_last_checkpoint", f"_delta_log/{1000:020d}.json"]

    table.reset()
    began = now_ms()
    delta_write(path, 1001, "q", 1001, at_ms=began + 40)
    assert sink_wrote(sink, progress("q", 1001, began))
    pointer = "_delta_log/_last_checkpoint"  # sorts after every version's files: in each listing, never read again
    assert table.listed == [f"_delta_log/{1001:020d}.json", pointer], "only what is new since the last check"
    assert table.read_keys == [f"_delta_log/{1001:020d}.json"]

    table.reset()  # batch 1002 committed nothing: one listing of nothing new, nothing read
    assert not sink_wrote(sink, progress("q", 1002, now_ms()))
    assert (table.listed, table.read_keys) == ([pointer], [])


def test_a_batch_that_wrote_is_not_taken_for_skipped_because_another_hosts_clock_is_behind(tmp_path: Path) -> None:
    """A blue/green cutover: the new version (query "blue") commits in turns with the old one ("green") on a host
    whose clock is behind. A commit of green's made after blue's batch, stamped minutes before that batch began,
    does not hide blue's commit of it; nor does any stamp once the driver has looked at the log before a batch."""
    table = tmp_path / "table"
    listener, deployments = listener_on(table, tmp_path / "store")
    for version in range(3):
        delta_write(table, version, "blue", version, at_ms=now_ms() - 10 * MINUTE_MS)

    began = now_ms() - 1_000  # before the driver first looked at the log: told by the stamps, with an allowance
    delta_write(table, 3, "blue", 3, at_ms=began + 40)
    delta_write(table, 4, "green", 70, at_ms=began - 2 * MINUTE_MS)  # its clock is two minutes behind
    listener.progress(progress("blue", 3, began))
    assert deployments.status("j", "d").unprocessed is None, "batch 3 wrote: not counted"

    for batch, version in ((4, 5), (5, 7)):  # after a look: told by versions, whatever green's clock says
        began = now_ms()
        delta_write(table, version, "blue", batch, at_ms=began + 40)
        delta_write(table, version + 1, "green", 70 + batch, at_ms=began - 30 * MINUTE_MS)
        listener.progress(progress("blue", batch, began))
    status = deployments.status("j", "d")
    assert status.unprocessed is None and status.skipping() is None, status.unprocessed


def test_a_batch_whose_commit_an_earlier_run_made_is_still_counted_as_skipped(tmp_path: Path) -> None:
    """A restore behind the table under the same query id: the earlier run committed batches 1..4, so Delta skips
    them in this run and commits nothing. Its commits are older than the batches, by their stamps for the first
    batch the driver asks about and by the log's versions after that, even where the earlier run's host has a
    clock ahead of this driver's by ten minutes (its stamps then lie after the batches began)."""
    table = tmp_path / "table"
    listener, deployments = listener_on(table, tmp_path / "store")
    began = now_ms() - 1_000
    delta_write(table, 0, "q", 1, at_ms=began - MINUTE_MS)
    for version in range(1, 4):  # batches 2..4, stamped on a clock ten minutes ahead
        delta_write(table, version, "q", version + 1, at_ms=now_ms() + 10 * MINUTE_MS)

    listener.progress(progress("q", 1, began))
    status = deployments.status("j", "d")
    assert status.unprocessed == {"first": 1, "last": 1, "batches": 1, "streak": 1, "records": 10}
    listener.progress(progress("q", 2, now_ms()))
    listener.progress(progress("q", 3, now_ms()))
    status = deployments.status("j", "d")
    assert status.unprocessed is not None and status.unprocessed["streak"] == 3, status.unprocessed
    assert status.skipping() is not None

    began = now_ms()  # batch 5 is above the earlier run's: Delta writes it
    delta_write(table, 4, "q", 5, at_ms=began + 15)
    listener.progress(progress("q", 5, began))
    assert deployments.status("j", "d").skipping() is None, "a batch that wrote ends the streak"
