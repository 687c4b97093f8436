"""A checkpoint on the store's S3 is snapshotted without its bytes passing through the engine: S3 copies each
file (CopyObject) and computes its SHA-256. What the client did is read from boto3's own event hooks on the
real client, against the moto server: no GetObject or PutObject of a file's content, only copies, and the
snapshot verifies and restores byte for byte."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_plugin.core.errors import IntegrityError
from airflow_plugin.core.layout import BLOBS
from airflow_plugin.core.snapshots.blobs import PackSettings
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.restore import execute_restore, plan_restore
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.snapshots.verify import verify_snapshot
from airflow_plugin.core.storage import S3Storage, open_storage
from tests.support.synthetic import tree, write_checkpoint


@pytest.fixture
def calls(s3_store: str) -> Iterator[Counter[str]]:
    """The S3 operations this process's client makes (by name), from here on."""
    client = open_storage(s3_store).client
    seen: Counter[str] = Counter()

    def record(model: object, **_: object) -> None:
        seen[model.name] += 1  # type: ignore[attr-defined]

    client.meta.events.register("before-call.s3", record)
    yield seen
    client.meta.events.unregister("before-call.s3", record)


def checkpoint_on_s3(s3_store: str, tmp_path: Path, *, with_checksums: bool) -> tuple[S3Storage, Path]:
    """A checkpoint layout uploaded to S3 the way S3A writes it: with or without a SHA-256 per object."""
    local = write_checkpoint(tmp_path / "local", batches=6, partitions=3)
    bucket = open_storage(s3_store)
    assert isinstance(bucket, S3Storage)
    checkpoint = S3Storage(bucket.bucket, "checkpoints/orders", bucket.settings)
    extra = {"ChecksumAlgorithm": "SHA256"} if with_checksums else {}
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        key = f"{checkpoint.prefix}/{path.relative_to(local)}"
        bucket.client.put_object(Bucket=bucket.bucket, Key=key, Body=path.read_bytes(), **extra)
    bucket.client.put_object(Bucket=bucket.bucket, Key=f"{checkpoint.prefix}/state/", Body=b"")  # a marker
    return checkpoint, local


@pytest.mark.parametrize("with_checksums", [True, False], ids=["S3 knows each SHA-256", "S3 computes them"])
def test_a_snapshot_of_a_checkpoint_on_the_stores_s3_copies_every_file_within_s3(
    s3_store: str, tmp_path: Path, calls: Counter[str], with_checksums: bool
) -> None:
    store = SnapshotStore(open_storage(s3_store))
    store.blobs.init_format(PackSettings(threshold=0))  # every file its own object: each one a copy
    checkpoint, local = checkpoint_on_s3(s3_store, tmp_path, with_checksums=with_checksums)
    calls.clear()

    manifest = create_snapshot(store, checkpoint, SnapshotRequest(job="orders"))

    files = len(manifest.files)
    contents = len({entry.sha256 for entry in manifest.files})
    assert files > 10 and all(entry.key.startswith(BLOBS) for entry in manifest.files)
    assert calls["CopyObject"] == (contents if with_checksums else files + contents)
    # the manifest, IN_PROGRESS then COMPLETED, each between a mark and a settle of the job's catalog (created
    # with the first mark): no file content
    assert calls["PutObject"] == 2 + 2 * 2 + 1
    assert calls["UploadPart"] == 0
    if with_checksums:  # no file content read: only the batch's metadata, offsets, commits; the catalog (a
        # first miss, then 304s before each conditional write) and the IN_PROGRESS manifest before its commit
        assert calls["GetObject"] <= 1 + 6 + 5 + 1, "no file content read"
    assert not [info.key for info in store.storage.list(f"{BLOBS}staging/")], "staging objects left behind"

    assert verify_snapshot(store, "orders", manifest.id).ok
    restored = tmp_path / "restored"
    execute_restore(store, plan_restore(store, "orders", manifest.id, open_storage(str(restored))))
    assert tree(restored) == {k: v for k, v in tree(local).items() if k in {e.path for e in manifest.files}}


def test_a_second_snapshot_copies_nothing_it_already_holds(s3_store: str, tmp_path: Path, calls: Counter[str]) -> None:
    store = SnapshotStore(open_storage(s3_store))
    store.blobs.init_format(PackSettings(threshold=0))
    checkpoint, _ = checkpoint_on_s3(s3_store, tmp_path, with_checksums=True)
    create_snapshot(store, checkpoint, SnapshotRequest(job="orders"))
    calls.clear()
    second = create_snapshot(store, checkpoint, SnapshotRequest(job="orders"))
    assert second.uploaded_files == 0 and calls["CopyObject"] == 0


def test_a_restore_into_the_stores_s3_copies_each_stored_object_within_s3(
    s3_store: str, tmp_path: Path, calls: Counter[str]
) -> None:
    store = SnapshotStore(open_storage(s3_store))
    store.blobs.init_format(PackSettings(threshold=0))
    checkpoint, local = checkpoint_on_s3(s3_store, tmp_path, with_checksums=True)
    manifest = create_snapshot(store, checkpoint, SnapshotRequest(job="orders"))
    target = open_storage(s3_store.rsplit("/", 1)[0] + "/restored/orders")
    plan = plan_restore(store, "orders", manifest.id, target)
    calls.clear()

    execute_restore(store, plan)

    assert calls["CopyObject"] == len(manifest.files)
    assert calls["GetObject"] == 0 and calls["PutObject"] == 0
    restored = {info.key: target.read(info.key) for info in target.list()}
    assert restored == {k: v for k, v in tree(local).items() if k in {e.path for e in manifest.files}}


def test_a_restore_finds_a_stored_object_that_does_not_match_its_checksum(s3_store: str, tmp_path: Path) -> None:
    store = SnapshotStore(open_storage(s3_store))
    store.blobs.init_format(PackSettings(threshold=0))
    checkpoint, _ = checkpoint_on_s3(s3_store, tmp_path, with_checksums=True)
    manifest = create_snapshot(store, checkpoint, SnapshotRequest(job="orders"))
    victim = next(entry for entry in manifest.files if entry.path.startswith("state/"))
    store.storage.write(victim.key, b"rotten")
    target = open_storage(s3_store.rsplit("/", 1)[0] + "/restored/orders")
    with pytest.raises(IntegrityError, match=victim.path.split("/")[-1]):
        execute_restore(store, plan_restore(store, "orders", manifest.id, target))
    assert list(target.list()) == [], "nothing left of the failed restore"


def test_copies_within_s3_go_largest_first(s3_store: str, tmp_path: Path) -> None:
    """A pool of copies ends with its last copy: the largest go first, so that no large one runs on alone at the
    end (a snapshot and a restore, one copy at a time so that the order is the order asked for)."""
    store = SnapshotStore(open_storage(s3_store))
    store.blobs.init_format(PackSettings(threshold=0))
    checkpoint, _ = checkpoint_on_s3(s3_store, tmp_path, with_checksums=True)
    sizes = {info.key: info.size for info in checkpoint.list()}
    client = checkpoint.client
    sources: list[str] = []

    def record(params: dict[str, object], **_: object) -> None:
        source = params["CopySource"]
        sources.append(source["Key"] if isinstance(source, dict) else str(source).split("/", 1)[1])

    client.meta.events.register("provide-client-params.s3.CopyObject", record)
    try:
        manifest = create_snapshot(store, checkpoint, SnapshotRequest(job="orders"), concurrency=1)
        copied = [sizes[key.removeprefix(checkpoint.prefix + "/")] for key in sources]
        assert len(set(copied)) > 3 and copied == sorted(copied, reverse=True)

        sources.clear()
        target = open_storage(s3_store.rsplit("/", 1)[0] + "/restored/orders")
        execute_restore(store, plan_restore(store, "orders", manifest.id, target), concurrency=1)
        blobs = [key.removeprefix(store.storage.prefix + "/") for key in sources]
        commits = [entry for entry in manifest.files if entry.path.startswith("commits/")]
        # commits/ last (a restore's rule): the last copies are exactly theirs; each of the two groups largest first
        body, last = blobs[: len(blobs) - len(commits)], blobs[len(blobs) - len(commits) :]
        assert commits and Counter(last) == Counter(entry.key for entry in commits)
        by_blob = {entry.key: entry.size for entry in manifest.files}
        body_sizes, last_sizes = [by_blob[key] for key in body], [by_blob[key] for key in last]
        assert len(set(body_sizes)) > 3 and body_sizes == sorted(body_sizes, reverse=True)
        assert last_sizes == sorted(last_sizes, reverse=True)
    finally:
        client.meta.events.unregister("provide-client-params.s3.CopyObject", record)
