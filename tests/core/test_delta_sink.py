"""The Delta sink's log as the engine reads it (core/sinks/delta.py), on logs laid out as Delta writes them:
one `_delta_log/<20 digits>.json` per version, newline-delimited actions, a streaming write's `txn` carrying
(query id, batch id), RESTORE's commitInfo naming the version it went back to. Spark writes them for real in
tests/e2e/test_s3a_checkpoints.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_plugin.core.errors import Refused
from airflow_plugin.core.guards import sink as guard
from airflow_plugin.core.sinks import DELTA, SinkRef, delta, from_description
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.restore import execute_restore, plan_restore
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import LocalStorage, ObjectInfo
from tests.support.synthetic import QUERY_ID, write_checkpoint

Q1, Q2 = "query-one", "query-two"


def commit(table: Path, version: int, *actions: dict[str, Any]) -> None:
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def write(table: Path, version: int, query: str, batch: int, at_ms: int = 0) -> None:
    info = {"operation": "STREAMING UPDATE", "operationParameters": {"queryId": query}, "timestamp": at_ms}
    commit(
        table,
        version,
        {"commitInfo": info},
        {"txn": {"appId": query, "version": batch, "lastUpdated": 1}},
        {"add": {"path": f"part-{version}%20x.parquet", "size": 10, "dataChange": True}},
    )


def restore(table: Path, version: int, to: int, removed: list[int]) -> None:
    commit(
        table,
        version,
        {"commitInfo": {"operation": "RESTORE", "operationParameters": {"version": to, "timestamp": None}}},
        *({"remove": {"path": f"part-{v}%20x.parquet", "dataChange": True}} for v in removed),
    )


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "table"
    write(path, 0, Q1, 0)  # batches 0..4 of Q1 are versions 0..4
    for batch in range(1, 5):
        write(path, batch, Q1, batch)
    (path / "_delta_log" / "00000000000000000004.crc").write_text("{}")  # Delta's own checksum: not a commit
    (path / "_delta_log" / ".00000000000000000005.json.1234.tmp").write_text("half")  # in flight
    return path


def test_spark_reports_a_delta_sink_by_its_path() -> None:
    assert from_description("DeltaSink[s3a://lake/out]") == SinkRef(DELTA, "s3a://lake/out")


def test_the_version_at_a_batch_is_the_one_before_the_querys_next_batch(table: Path) -> None:
    storage = LocalStorage(table)
    assert list(delta.commit_keys(storage)) == [0, 1, 2, 3, 4]
    assert delta.last_batch(storage, Q1, None) == 4
    assert delta.version_at(storage, Q1, 2, None) == 2
    assert delta.version_at(storage, Q1, 4, None) == 4
    assert delta.version_at(storage, Q1, 9, None) == 4  # the table has nothing beyond: its newest version


def test_a_new_query_id_that_wrote_nothing_yet_is_at_the_newest_version(table: Path) -> None:
    restore(table, 5, to=2, removed=[3, 4])
    storage = LocalStorage(table)
    assert delta.version_at(storage, Q2, 2, None) == 5  # the RESTORE holds batches up to 2
    write(table, 6, Q2, 3)
    assert delta.version_at(storage, Q2, 2, None) == 5
    assert delta.version_at(storage, Q2, 3, None) == 6


MINUTE = 60_000


def test_two_queries_committing_in_turns_are_read_as_two_writers(tmp_path: Path) -> None:
    """A blue/green cutover: the old version (Q1) commits between the new one's (Q2) batches. Whether Q2 committed a
    batch is read past Q1's commits, and stops only at a commit of another query made well before the batch
    asked about was planned (the log's older commits are never read: here one is unreadable)."""
    table = tmp_path / "table"
    start = 100 * MINUTE
    for version in range(3):  # an earlier deployment's query, long before
        write(table, version, "query-zero", version, at_ms=version)
    (table / "_delta_log" / f"{0:020d}.json").write_text("not json")
    for version, (query, batch) in enumerate([(Q1, 7), (Q2, 4), (Q1, 8), (Q2, 5), (Q1, 9), (Q1, 10)], start=3):
        write(table, version, query, batch, at_ms=start + version * 1000)
    storage = LocalStorage(table)
    planned = start  # Q2's batch 4 was planned about when the cutover began
    assert delta.last_batch(storage, Q2, planned) == 5, "Q1's two newer commits do not hide Q2's publish"
    assert delta.version_at(storage, Q2, 4, planned) == 5, "up to batch 4 and nothing after: before version 6"
    assert delta.version_at(storage, Q2, 5, planned) == 8, "the newest: Q1's later commits hold nothing of Q2's"
    assert delta.batches_after(storage, Q2, 3) == [4, 5] and delta.batches_after(storage, Q2, 5) == [5]
    assert delta.last_batch(storage, "query-three", planned) is None, "nothing of it, and the old log left unread"
    with pytest.raises(ValueError):
        delta.last_batch(storage, "query-three", None)  # read to the first commit, which is not JSON


def test_the_sink_guard_sees_a_querys_batch_behind_another_querys_commits(tmp_path: Path) -> None:
    """A later attempt of the new version's driver, whose checkpoint ends at batch 4 while the table holds its batch
    5 under the old version's newer commits: the guard finds batch 5 (it would not start a query that skips it)."""
    table = tmp_path / "table"
    for version, (query, batch) in enumerate([(Q1, 7), (Q2, 4), (Q2, 5), (Q1, 8)]):
        write(table, version, query, batch, at_ms=10 * MINUTE + version)
    found = guard.ahead(SinkRef(DELTA, str(table)), LocalStorage(table), 4, Q2, 10 * MINUTE)
    assert found is not None and found.skipped == "5" and not found.duplicates


def test_writes_after_a_version_are_what_a_restore_would_skip_or_duplicate(table: Path) -> None:
    storage = LocalStorage(table)
    assert delta.writes_after(storage, 4) == []
    ahead = delta.writes_after(storage, 2)
    assert [(w.version, w.query_id, w.batch_id) for w in ahead] == [(3, Q1, 3), (4, Q1, 4)]
    assert delta.describe_writes(ahead) == f"batches 3..4 of query {Q1}"


def test_a_rewind_done_is_not_ahead_any_more_and_later_writes_are(table: Path) -> None:
    restore(table, 5, to=2, removed=[3, 4])
    storage = LocalStorage(table)
    assert delta.writes_after(storage, 2) == []  # a repeated restore does not rewind again
    assert delta.restored_versions(storage) == [2]
    write(table, 6, Q2, 3)  # the restored query, under its new id
    assert [(w.query_id, w.batch_id) for w in delta.writes_after(storage, 2)] == [(Q2, 3)]
    assert [(w.query_id, w.batch_id) for w in delta.writes_after(storage, 1)] == [(Q1, 2), (Q2, 3)]
    restore(table, 7, to=3, removed=[6])  # back to version 3: Q1's batches 2 and 3, not Q2's
    assert [(w.query_id, w.batch_id) for w in delta.writes_after(storage, 1)] == [(Q1, 2), (Q1, 3)]


def test_the_files_of_the_newest_version_follow_adds_and_removes(table: Path) -> None:
    restore(table, 5, to=2, removed=[3, 4])
    assert delta.live_files(LocalStorage(table)) == ["part-0 x.parquet", "part-1 x.parquet", "part-2 x.parquet"]


def test_history_cleaned_up_after_the_snapshot_cannot_be_checked(table: Path) -> None:
    (table / "_delta_log" / "00000000000000000003.json").unlink()
    with pytest.raises(Refused, match=r"no longer holds version 3.*restore a newer snapshot"):
        delta.writes_after(LocalStorage(table), 2)


def test_a_rewind_plan_says_how_to_undo_it_and_gives_a_new_query_id(table: Path) -> None:
    storage = LocalStorage(table)
    plan = delta.plan_rewind(storage, 2, delta.writes_after(storage, 2), None)
    described = plan.describe()
    assert described["restored_to_version"] == 2 and plan.current == 4
    assert described["undo"].endswith("TO VERSION AS OF 4")
    assert plan.query_id not in (Q1, Q2) and len(plan.query_id) == 36
    assert "batches 3..4" in plan.summary()


def test_a_snapshot_records_the_table_and_a_restore_behind_it_is_refused_or_gets_a_new_query_id(
    tmp_path: Path,
) -> None:
    """Through the engine: the snapshot of batch 2 records version 2; after batches 3..4 the restore is
    refused, nothing written; with the rewind the plan RESTOREs to version 2 (run by Spark: left out here)
    and the restored checkpoint carries the new query id."""
    checkpoint = write_checkpoint(tmp_path / "ckpt", batches=3)  # batches 0..2 of QUERY_ID
    table = tmp_path / "table"
    for batch in range(3):
        write(table, batch, QUERY_ID, batch)
    store = SnapshotStore(LocalStorage(tmp_path / "store"))
    sinks = (SinkRef(DELTA, f"file:{table}"),)
    manifest = create_snapshot(store, LocalStorage(checkpoint), SnapshotRequest(job="orders", sinks=sinks))
    assert manifest.sinks == [{"kind": DELTA, "location": f"file:{table}", "last_batch_id": 2, "version": 2}]
    for batch in (3, 4):  # the query went on
        write(table, batch, QUERY_ID, batch)

    target = tmp_path / "restored"
    with pytest.raises(Refused, match=rf"Delta table file:{table} holds batches 3..4 of query {QUERY_ID}"):
        plan_restore(store, "orders", manifest.id, LocalStorage(target))
    assert not target.exists()

    plan = plan_restore(store, "orders", manifest.id, LocalStorage(target), rewind_sink=True)
    [(_, rewind)] = plan.rewinds
    assert isinstance(rewind, delta.Rewind) and rewind.version == 2 and plan.query_id == rewind.query_id
    assert plan.describe()["new_query_id"] == rewind.query_id
    plan.rewinds = []  # Delta's RESTORE needs Spark (tests/e2e/test_s3a_checkpoints.py runs it)
    execute_restore(store, plan)
    assert json.loads((target / "metadata").read_text()) == {"id": rewind.query_id}
    assert (target / "commits" / "2").exists() and not (target / "commits" / "3").exists()


def test_a_restore_to_version_0_is_read_as_such_and_a_new_query_on_an_old_table_is_at_its_newest(
    table: Path,
) -> None:
    restore(table, 5, to=0, removed=[1, 2, 3, 4])
    storage = LocalStorage(table)
    assert delta.restored_versions(storage) == [0]
    assert delta.writes_after(storage, 0) == []
    write(table, 6, Q2, 0, at_ms=20 * MINUTE)  # a fresh deployment: a new query id writes batch 0 on top
    assert delta.version_at(storage, Q2, 0, None) == 6 and delta.version_at(storage, "fresh", 3, None) == 6
    # Delta keeps a query's txn through a RESTORE: Q1 restarted under its own id would still skip batches up to 4
    assert delta.last_batch(storage, Q1, None) == 4


def test_a_table_created_after_the_snapshot_is_refused_with_nothing_written(tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path / "ckpt", batches=3)
    table, store = tmp_path / "table", SnapshotStore(LocalStorage(tmp_path / "store"))
    sinks = (SinkRef(DELTA, f"file:{table}"),)
    manifest = create_snapshot(store, LocalStorage(checkpoint), SnapshotRequest(job="orders", sinks=sinks))
    assert manifest.sinks[0]["version"] is None  # no table yet
    write(table, 0, QUERY_ID, 3)
    target = tmp_path / "restored"
    with pytest.raises(Refused, match=r"did not exist at snapshot .*move the table aside"):
        plan_restore(store, "orders", manifest.id, LocalStorage(target), rewind_sink=True)
    assert not target.exists() and delta.commit_keys(LocalStorage(table)) == {0: "_delta_log/" + "0" * 20 + ".json"}


class Clock:
    """The driver's clock, in ms, moved by the test."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> float:
        return self.ms / 1000


def test_a_look_made_after_a_batch_began_does_not_tell_it_by_versions(tmp_path: Path) -> None:
    """The listener runs behind the query: its check of batch 1 looks at the log after batch 2 began and committed.
    For batch 2 that look is no "before": batch 2 is told by its commit's stamp (this driver's clock). Batch 3
    began after a look, and is told by the version of its commit alone, whatever its stamp."""
    table = tmp_path / "table"
    write(table, 0, Q1, 1, at_ms=50_000)
    write(table, 1, Q1, 2, at_ms=56_000)  # batch 2 began at 55 s
    clock = Clock(60_000)
    watch = delta.LogWatch(LocalStorage(table), Q1, clock)
    assert watch.wrote(1, 40_000)
    clock.ms = 62_000
    assert watch.wrote(2, 55_000), "taken for Delta's skip if the look at 60 s were a look before the batch"
    write(table, 2, Q1, 3, at_ms=1)  # whatever the stamp
    clock.ms = 64_000
    assert watch.wrote(3, 63_000)
    clock.ms = 66_000
    assert not watch.wrote(4, 65_000), "no commit of batch 4"


def test_the_first_look_starts_at_the_newest_checkpoint_and_reads_below_it_by_name(tmp_path: Path) -> None:
    table = tmp_path / "table"
    for version in range(13):
        write(table, version, Q1 if version != 12 else Q2, version, at_ms=100_000 + version)
    (table / "_delta_log" / "_last_checkpoint").write_text(json.dumps({"version": 12, "size": 3}))
    (table / "_delta_log" / "_sidecars").mkdir()
    for n in range(20):  # a V2 checkpoint's parts: they sort after every version's files, and are not listed
        (table / "_delta_log" / "_sidecars" / f"{n:04d}.parquet").write_bytes(b"PAR1")
    listed: list[str] = []

    class Listing(LocalStorage):
        def list(self, prefix: str = "", start_after: str = "") -> Iterator[ObjectInfo]:
            for info in super().list(prefix, start_after):
                listed.append(info.key)
                yield info

    watch = delta.LogWatch(Listing(table), Q1, Clock(200_000))
    assert watch.wrote(11, 100_000)  # at version 11, below the checkpoint's: read by its name
    assert listed == [delta.commit_key(12), delta.LAST_CHECKPOINT]


def test_told_by_stamps_a_read_down_the_log_ends_before_the_batch_began_less_the_allowance(tmp_path: Path) -> None:
    """Before its first look the driver has only stamps: a commit stamped before the batch began by more than
    SKEW_MS came before it, and so did every older one (here the query's commit of the batch, an earlier run's,
    stamped on a clock far ahead). One gone from the log (Delta's cleanup) cannot tell either."""
    table = tmp_path / "table"
    began = 10 * MINUTE
    write(table, 0, Q1, 5, at_ms=began + 1)
    write(table, 1, Q2, 0, at_ms=began - delta.SKEW_MS + 1)
    assert delta.LogWatch(LocalStorage(table), Q1, Clock(began + 5_000)).wrote(5, began), "within the allowance"
    write(table, 2, Q2, 1, at_ms=began - delta.SKEW_MS - 1)
    assert not delta.LogWatch(LocalStorage(table), Q1, Clock(began + 5_000)).wrote(5, began)
    (table / "_delta_log" / f"{1:020d}.json").unlink()
    write(table, 2, Q2, 1, at_ms=began)
    assert not delta.LogWatch(LocalStorage(table), Q1, Clock(began + 5_000)).wrote(5, began)
