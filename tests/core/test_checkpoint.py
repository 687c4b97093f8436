"""checkpoint.py directly: which batch N a checkpoint restarts at, and exactly which files that needs
(synthetic checkpoints with Spark's layout; real ones of every kind are in test_roundtrip.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_plugin.core.errors import CheckpointError, NotFound
from airflow_plugin.core.snapshots.checkpoint import CHANGELOG_CONF, is_transient, read_restart_point
from airflow_plugin.core.storage import LocalStorage
from tests.support.synthetic import QUERY_ID, add_batch, write_checkpoint


def _keys(root: Path) -> set[str]:
    return {info.key for info in read_restart_point(LocalStorage(root)).files}


def test_n_is_the_newest_committed_batch_and_only_its_files_are_taken(tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path / "ck", batches=5)
    point = read_restart_point(LocalStorage(root))
    assert (point.batch_id, point.pending_batch_id, point.query_id) == (4, None, QUERY_ID)
    keys = {info.key for info in point.files}
    assert {"metadata", "offsets/3", "offsets/4", "commits/4", "sources/0/0"} <= keys
    assert not {"offsets/2", "commits/3"} & keys  # older logs are not needed to restart at 4
    # HDFS state: version N+1 = 5 rebuilds from the deltas (no snapshot file yet): all of them
    assert {f"state/0/{p}/{v}.delta" for p in (0, 1) for v in range(1, 6)} <= keys
    assert {"state/0/_metadata/metadata", "state/0/0/_metadata/schema", "state/0/1/_metadata/schema"} <= keys
    assert point.watermark_ms == 4000 and point.spark_conf == {"spark.sql.shuffle.partitions": "2"}
    assert point.source_offsets == ["40"] and point.restore_conf == {}
    assert point.operators == [{"id": 0, "name": "stateStoreSave", "stores": [{"name": "default", "partitions": 2}]}]


def test_a_batch_logged_without_a_commit_is_kept_so_it_replays_exactly(tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path / "ck", batches=3, pending=True)
    point = read_restart_point(LocalStorage(root))
    assert (point.batch_id, point.pending_batch_id) == (2, 3)
    assert {"offsets/3", "offsets/2", "commits/2"} <= {info.key for info in point.files}
    assert "state/0/0/4.delta" not in {info.key for info in point.files}  # written by batch 3: not committed


def test_a_commit_without_its_offsets_is_not_a_restart_point(tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path / "ck", batches=3)
    (root / "commits/5").write_text('v1\n{"nextBatchWatermarkMs":0}')  # a foreign or half-deleted log entry
    assert read_restart_point(LocalStorage(root)).batch_id == 2


def test_temporary_and_hadoop_checksum_files_never_travel_but_spark_checksums_do(tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path / "ck", batches=2)
    (root / "state/0/0/.2.delta.crc").write_bytes(b"hadoop crc")
    (root / "state/0/0/.3.delta.5f1d.tmp").write_bytes(b"half written")
    (root / "commits/1.crc").write_text('{"checksum": 1}')  # Spark 4.1+ JSON checksum of a kept file
    keys = _keys(root)
    assert "commits/1.crc" in keys and not any(is_transient(key.rsplit("/", 1)[-1]) for key in keys)
    assert is_transient(".x.crc") and is_transient("x.tmp") and not is_transient("1.delta")


def test_a_file_source_log_stops_at_the_last_kept_batch(tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path / "ck", batches=3)
    for batch in range(3):
        (root / f"offsets/{batch}").write_text(
            "v1\n" + json.dumps({"batchWatermarkMs": 0, "conf": {}}) + "\n" + json.dumps({"logOffset": batch})
        )
    for entry in range(5):  # the source logged files for batches 3 and 4 that were never processed
        (root / f"sources/0/{entry}").write_text("v1\n{}")
    keys = _keys(root)
    assert {f"sources/0/{e}" for e in range(3)} <= keys and not {"sources/0/3", "sources/0/4"} & keys


def test_changelog_checkpointing_is_carried_over_as_a_restore_conf(tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path / "ck", batches=2)
    for delta in root.glob("state/0/*/*.delta"):  # RocksDB with changelog checkpointing, before any zip
        delta.rename(delta.with_suffix(".changelog"))
    point = read_restart_point(LocalStorage(root))
    assert point.restore_conf == {CHANGELOG_CONF: "true"}
    assert {f"state/0/{p}/{v}.changelog" for p in (0, 1) for v in (1, 2)} <= {i.key for i in point.files}


def test_what_is_not_a_usable_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="does not exist or is empty"):
        read_restart_point(LocalStorage(tmp_path / "nothing"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other/readme").write_text("not spark")
    with pytest.raises(CheckpointError, match="no 'metadata' file"):
        read_restart_point(LocalStorage(tmp_path / "other"))
    root = write_checkpoint(tmp_path / "fresh", batches=0)
    add_batch(root, 0, commit=False)
    with pytest.raises(CheckpointError, match="no committed batch yet"):
        read_restart_point(LocalStorage(root))
    (root / "commits/0").write_text("garbage")
    with pytest.raises(CheckpointError, match="not a Spark log file"):
        read_restart_point(LocalStorage(root))


def test_state_that_was_never_written_is_refused_with_its_cause(tmp_path: Path) -> None:
    """Batches committed while the sink skipped them never ran, so no state store ever wrote a version: a
    snapshot of that could never be restored (docs/spark-checkpoints.md section 12)."""
    root = write_checkpoint(tmp_path / "ck", batches=4, partitions=3)
    for partition in (1, 2):  # only their schema (written when the query was planned) is there
        for delta in (root / f"state/0/{partition}").glob("*.delta"):
            delta.unlink()
    with pytest.raises(CheckpointError) as caught:
        read_restart_point(LocalStorage(root))
    message = str(caught.value)
    assert "has committed batch 3, but its state has no files at all for operator 0 store default partitions 1..2" in (
        message
    )
    assert "A sink that skipped batches as already written leaves exactly this" in message
