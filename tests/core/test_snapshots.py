"""The snapshot engine on synthetic checkpoints (no JVM): consistency rules, incremental storage,
restore, verify, delete, local and S3 (moto server) stores."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from airflow_plugin.core.errors import CheckpointError, IntegrityError, Refused
from airflow_plugin.core.records.manifest import Kind, Manifest, SnapshotStatus
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.lifecycle import delete_snapshot, set_pinned
from airflow_plugin.core.snapshots.restore import execute_restore, plan_restore
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.snapshots.verify import verify_snapshot
from airflow_plugin.core.storage import LocalStorage, S3Storage, open_storage
from tests.support.synthetic import add_batch, tree, write_checkpoint


def snapshot(store_uri: str, checkpoint: Path | str, **request: object):
    store = SnapshotStore(open_storage(store_uri))
    return store, create_snapshot(store, open_storage(str(checkpoint)), SnapshotRequest(job="orders", **request))


def test_snapshot_holds_exactly_the_files_of_the_latest_committed_batch(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=5)
    (ckpt / "state/0/0/.6.delta.abc.tmp").write_text("in flight")
    (ckpt / "state/0/0/.5.delta.crc").write_text("hadoop checksum")
    _, manifest = snapshot(str(tmp_path / "store"), ckpt)

    assert manifest.status is SnapshotStatus.COMPLETED and manifest.batch_id == 4 and manifest.pending_batch_id is None
    paths = {f.path for f in manifest.files}
    assert {"metadata", "offsets/3", "offsets/4", "commits/4", "sources/0/0"} <= paths
    assert not {"offsets/2", "commits/3"} & paths
    # batch 4 needs state version 5: deltas 1..5 of every partition, nothing in flight
    assert {f"state/0/{p}/{v}.delta" for p in (0, 1) for v in range(1, 6)} <= paths
    assert not any(".tmp" in p or p.endswith(".crc") for p in paths)
    assert manifest.watermark_ms == 4000 and manifest.source_offsets == ["40"]
    assert manifest.operators[0]["name"] == "stateStoreSave"
    assert manifest.total_bytes == sum((ckpt / p).stat().st_size for p in paths)
    # identical contents (the two partitions' schema files, equal commit files) are stored once
    assert manifest.uploaded_bytes == sum({f.sha256: f.size for f in manifest.files}.values())


def test_pending_offsets_without_commit_are_kept(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=3, pending=True)
    _, manifest = snapshot(str(tmp_path / "store"), ckpt)
    paths = {f.path for f in manifest.files}
    assert manifest.batch_id == 2 and manifest.pending_batch_id == 3
    assert "offsets/3" in paths and "commits/3" not in paths
    # the replayed batch 3 rebuilds version 4 itself: the state files of version 4 are left out
    assert "state/0/0/4.delta" not in paths and "state/0/0/3.delta" in paths


def test_restore_recreates_the_checkpoint_and_refuses_a_non_empty_target(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=4)
    store, manifest = snapshot(str(tmp_path / "store"), ckpt)
    target = open_storage(str(tmp_path / "restored"))
    result = execute_restore(store, plan_restore(store, "orders", "latest", target))

    restored = tree(tmp_path / "restored")
    assert restored == {f.path: (ckpt / f.path).read_bytes() for f in manifest.files}
    assert result["resumes_at_batch"] == 4
    assert result["spark_conf"]["spark.sql.shuffle.partitions"] == "2"

    with pytest.raises(Refused, match="is not empty"):
        plan_restore(store, "orders", manifest.id, target)
    assert tree(tmp_path / "restored") == restored


def test_second_snapshot_uploads_only_new_files_and_survives_deleting_the_first(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=5)
    store, first = snapshot(str(tmp_path / "store"), ckpt)
    for batch in range(5, 8):
        add_batch(ckpt, batch)
    _, second = snapshot(str(tmp_path / "store"), ckpt)

    old = {(f.path, f.sha256) for f in first.files}
    new_files = [f for f in second.files if (f.path, f.sha256) not in old]
    assert second.batch_id == 7
    assert 0 < second.uploaded_bytes <= sum(f.size for f in new_files)
    assert second.uploaded_bytes < second.total_bytes

    delete_snapshot(store, "orders", first.id)
    assert [m.id for m in store.list("orders")] == [second.id]
    assert verify_snapshot(store, "orders", second.id).ok
    execute_restore(store, plan_restore(store, "orders", second.id, open_storage(str(tmp_path / "r"))))
    assert tree(tmp_path / "r") == {f.path: (ckpt / f.path).read_bytes() for f in second.files}


def test_pinned_snapshot_is_not_deleted(tmp_path: Path) -> None:
    store, manifest = snapshot(str(tmp_path / "store"), write_checkpoint(tmp_path / "ckpt", batches=2), pinned=True)
    before = tree(tmp_path / "store")
    with pytest.raises(Refused, match="is pinned"):
        delete_snapshot(store, "orders", manifest.id)
    assert tree(tmp_path / "store") == before
    set_pinned(store, "orders", manifest.id, False)
    delete_snapshot(store, "orders", manifest.id)
    # no pack, no blob, no manifest left; the job's catalog lists nothing
    assert set(tree(tmp_path / "store")) == {"format.json", "jobs/orders/catalog/snapshots.json.gz"}
    assert store.list("orders") == []


def test_verify_finds_a_corrupt_blob_and_restore_leaves_the_target_empty(tmp_path: Path) -> None:
    store, manifest = snapshot(str(tmp_path / "store"), write_checkpoint(tmp_path / "ckpt", batches=3))
    victim = next(f for f in manifest.files if f.path == "commits/2")
    assert victim.key.startswith("packs/")  # small files are packed: bit rot inside the pack, in its range
    pack = tmp_path / "store" / victim.key
    stored = bytearray(pack.read_bytes())
    stored[victim.offset] ^= 0xFF
    pack.write_bytes(bytes(stored))

    report = verify_snapshot(store, "orders", manifest.id)
    assert not report.ok and report.problems == [
        f"commits/2: checksum mismatch (stored content {victim.key} {victim.byte_range} is corrupt)"
    ]
    assert store.get("orders", manifest.id).verification["ok"] is False

    target = tmp_path / "restored"
    with pytest.raises(IntegrityError, match="commits/2 does not match its checksum"):
        execute_restore(store, plan_restore(store, "orders", manifest.id, open_storage(str(target))))
    assert tree(target) == {}


def test_failed_and_in_progress_snapshots_cannot_be_restored(tmp_path: Path) -> None:
    store, manifest = snapshot(str(tmp_path / "store"), write_checkpoint(tmp_path / "ckpt", batches=2))
    for status, error in ((SnapshotStatus.FAILED, "disk full"), (SnapshotStatus.IN_PROGRESS, None)):

        def mark(current: Manifest, status: SnapshotStatus = status, error: str | None = error) -> None:
            current.status, current.error = status, error

        store.update("orders", manifest.id, mark)
        with pytest.raises(Refused, match=f"is {status}.*Pick a COMPLETED one"):
            plan_restore(store, "orders", manifest.id, open_storage(str(tmp_path / "r")))
    assert not (tmp_path / "r").exists()


def test_s3_store_and_s3_checkpoint(tmp_path: Path, s3_store: str) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=3, pending=True)
    bucket = s3_store.removeprefix("s3://").split("/")[0]
    checkpoint_uri = f"s3a://{bucket}/checkpoints/orders"
    remote = open_storage(checkpoint_uri)
    for path, data in tree(ckpt).items():
        remote.write(path, data)

    store, manifest = snapshot(s3_store, checkpoint_uri, kind=Kind.CHECKPOINT, labels={"reason": "test"})
    assert manifest.id.startswith("ck-") and manifest.batch_id == 2 and manifest.pending_batch_id == 3
    assert manifest.source == f"s3://{bucket}/checkpoints/orders"
    assert verify_snapshot(store, "orders", "latest").ok

    target = tmp_path / "restored"
    execute_restore(store, plan_restore(store, "orders", manifest.id, open_storage(f"file://{target}")))
    assert tree(target) == {f.path: (ckpt / f.path).read_bytes() for f in manifest.files}

    s3_target = open_storage(f"s3://{bucket}/restored")
    execute_restore(store, plan_restore(store, "orders", manifest.id, s3_target))
    assert {i.key for i in s3_target.list()} == {f.path for f in manifest.files}

    _, again = snapshot(s3_store, checkpoint_uri)
    assert again.uploaded_bytes == 0  # nothing changed: every file is known by path, size and mtime


def test_manifest_round_trips_and_stores_files_compactly(tmp_path: Path) -> None:
    store, manifest = snapshot(str(tmp_path / "store"), write_checkpoint(tmp_path / "ckpt", batches=2))
    raw = (tmp_path / "store" / f"jobs/orders/snapshots/{manifest.id}/manifest.json").read_bytes()
    data = json.loads(raw)
    assert data["status"] == "COMPLETED" and isinstance(data["files"][0], list)
    assert store.get("orders", manifest.id) == manifest


class CleanupDuringCopy(LocalStorage):
    """A checkpoint whose Spark cleanup runs while the first attempt copies: the first read of an old
    delta finds it deleted, and the query has committed another batch by then."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.cleaned = False

    def read(self, key: str) -> bytes:
        if not self.cleaned and key == "state/0/1/1.delta":
            self.cleaned = True
            add_batch(self.root, 5)
            add_batch(self.root, 6)
            (self.root / key).unlink()
            (self.root / "state/0/1/6.snapshot").write_bytes(b"snapshot of version 6")
        return super().read(key)


def test_file_deleted_mid_copy_retries_at_a_newer_batch(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=5)
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    manifest = create_snapshot(store, CleanupDuringCopy(ckpt), SnapshotRequest(job="orders"), concurrency=1)
    assert manifest.status is SnapshotStatus.COMPLETED and manifest.attempts == 2 and manifest.batch_id == 6
    paths = {f.path for f in manifest.files}
    # partition 1 now rebuilds version 7 from its snapshot 6 plus delta 7
    assert {"state/0/1/6.snapshot", "state/0/1/7.delta"} <= paths and "state/0/1/1.delta" not in paths
    assert verify_snapshot(store, "orders", manifest.id).ok


class CleanupDuringCopyOnS3(S3Storage):
    """The same on a checkpoint on S3 (the live-copy protocol over S3 listings): Spark's maintenance deletes
    an old delta object after the listing and before its read, and commits two more batches meanwhile."""

    cleaned = False

    def read(self, key: str) -> bytes:
        if not self.cleaned and key == "state/0/1/1.delta":
            self.cleaned = True
            for batch in (5, 6):
                for path, data in _batch_files(batch).items():
                    self.write(path, data)
            self.delete([key])
            self.write("state/0/1/6.snapshot", b"snapshot of version 6")
        return super().read(key)


def _batch_files(batch: int) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for directory in ("offsets", "commits", "state/0/0", "state/0/1"):
            (root / directory).mkdir(parents=True)
        add_batch(root, batch)
        return tree(root)


def test_an_s3_checkpoint_cleaned_up_mid_copy_is_snapshotted_at_a_newer_batch(tmp_path: Path, s3_store: str) -> None:
    bucket = s3_store.removeprefix("s3://").split("/")[0]
    checkpoint = CleanupDuringCopyOnS3(bucket, "checkpoints/cleaned")
    for path, data in tree(write_checkpoint(tmp_path / "ckpt", batches=5)).items():
        checkpoint.write(path, data)
    store = SnapshotStore(open_storage(s3_store))
    manifest = create_snapshot(store, checkpoint, SnapshotRequest(job="orders"), concurrency=1)
    assert checkpoint.cleaned, "the cleanup ran in the middle of the first attempt"
    assert manifest.status is SnapshotStatus.COMPLETED and manifest.attempts == 2 and manifest.batch_id == 6
    paths = {f.path for f in manifest.files}
    assert {"state/0/1/6.snapshot", "state/0/1/7.delta"} <= paths and "state/0/1/1.delta" not in paths
    assert verify_snapshot(store, "orders", manifest.id).ok


def test_gives_up_and_marks_failed_when_files_keep_vanishing(tmp_path: Path) -> None:
    class AlwaysCleaning(LocalStorage):
        def read(self, key: str) -> bytes:
            return super().read(key + ".gone" if key.endswith(".delta") else key)

    ckpt = write_checkpoint(tmp_path / "ckpt", batches=3)
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    with pytest.raises(CheckpointError, match="gave up after 3 attempts"):
        create_snapshot(store, AlwaysCleaning(ckpt), SnapshotRequest(job="orders"), max_attempts=3)
    [failed] = store.list("orders")
    assert failed.status is SnapshotStatus.FAILED and "gave up" in failed.error
    with pytest.raises(Refused):
        plan_restore(store, "orders", failed.id, open_storage(str(tmp_path / "r")))
