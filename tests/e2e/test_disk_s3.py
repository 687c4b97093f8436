"""What the engine relies on in S3, checked against the disk-backed S3 server (S3Proxy, devtools/disk_s3.py) that
the benchmarks at scale run on: conditional writes and deletes (leases, catalogs, the drivers' commit lock), a
checksum per object and CopyObject with ChecksumAlgorithm=SHA256 (snapshots and restores within S3), ranged GETs
(packs), multipart uploads and UploadPartCopy (large files; S3A's renames), ListObjectsV2 with a delimiter and
with StartAfter. Where the server answers otherwise than S3, the test says so by name, and docs/benchmarks.md
("The disk-backed S3 server") says what the engine does about it. The engine's own server-side copy tests then
run unchanged against it (tests/core/test_server_side_copy.py, imported)."""

from __future__ import annotations

import base64
import hashlib
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_plugin.core.errors import Conflict
from airflow_plugin.core.layout import BLOBS
from airflow_plugin.core.snapshots.blobs import PackSettings
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.restore import execute_restore, plan_restore
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.snapshots.verify import verify_snapshot
from airflow_plugin.core.storage import S3Settings, S3Storage, open_storage
from airflow_plugin.core.upgrades.preflight import conditional_writes
from devtools.disk_s3 import DiskS3
from tests.core.test_server_side_copy import (  # noqa: F401 (the fixture and tests, collected again here)
    calls,
    checkpoint_on_s3,
    test_a_restore_finds_a_stored_object_that_does_not_match_its_checksum,
    test_a_restore_into_the_stores_s3_copies_each_stored_object_within_s3,
    test_a_second_snapshot_copies_nothing_it_already_holds,
)
from tests.support.synthetic import tree

pytestmark = pytest.mark.slow(seconds=40)
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def disk_s3() -> Iterator[DiskS3]:
    with DiskS3() as server:
        yield server


@pytest.fixture
def s3_store(disk_s3: DiskS3, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on the disk-backed server, which this process's boto3 (the engine's) then talks to: what the
    conftest's fixture of the same name gives on moto, so that the imported tests run here."""
    for name, value in disk_s3.env().items():
        monkeypatch.setenv(name, value)
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    disk_s3.create_bucket(bucket)
    return f"s3://{bucket}/snapshots"


@pytest.fixture
def storage(s3_store: str) -> S3Storage:
    bucket = s3_store.removeprefix("s3://").split("/")[0]
    return S3Storage(bucket, "features", S3Settings(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB))


def test_conditional_writes_and_deletes_hold(storage: S3Storage) -> None:
    token = storage.create("lease.json", b"first")
    with pytest.raises(Conflict):
        storage.create("lease.json", b"second")  # If-None-Match: *
    with pytest.raises(Conflict):
        storage.replace("lease.json", b"third", '"00000000000000000000000000000000"')  # If-Match, another version
    with pytest.raises(Conflict):
        storage.replace("missing.json", b"x", token)  # If-Match on a key that does not exist
    assert storage.read("lease.json") == b"first"
    # the lease's one-request acquire names a content's ETag computed, not read: a single PUT's ETag is its MD5
    assert storage.token_of(b"first") == token
    token = storage.replace("lease.json", b"fourth", token)
    assert storage.read_with_token("lease.json") == (b"fourth", token)
    assert storage.read_if_changed("lease.json", token) is None  # a conditional GET: 304
    with pytest.raises(Conflict):
        storage.delete_if("lease.json", '"00000000000000000000000000000000"')  # DELETE with If-Match
    assert storage.read("lease.json") == b"fourth"
    assert storage.delete_if("lease.json", token) is True
    assert storage.stat("lease.json") is None
    # S3 answers a conditional DELETE of a key that is gone with 404 (False: "already gone"); S3Proxy with 204, as
    # an unconditional one: a lease broken by someone else meanwhile reads as broken here, gone either way
    assert storage.delete_if("lease.json", token) is True, "S3Proxy now answers 404: docs/benchmarks.md says 204"
    assert conditional_writes(storage) is True  # what an upgrade's pre-flight asks of a table's storage


def test_a_copy_keeps_the_sha256_an_object_was_written_with(storage: S3Storage) -> None:
    """S3 answers a CopyObject that asks for a SHA-256 with the checksum of what it copied. S3Proxy answers without
    it, but keeps the checksum an object was written with (refusing a PUT whose body does not match it) and carries
    it along with the copy: the engine reads it from the copy's HEAD (storage/s3.py `copy_from`)."""
    data = bytes(range(256)) * 4096
    digest = hashlib.sha256(data).digest()
    key = storage._key("checkpoint/state/0/1/000008.sst")
    storage.client.put_object(Bucket=storage.bucket, Key=key, Body=data, ChecksumAlgorithm="SHA256")
    assert storage.sha256("checkpoint/state/0/1/000008.sst") == (digest.hex(), len(data))

    answer = storage.client.copy_object(
        Bucket=storage.bucket,
        Key=storage._key("copied/raw"),
        CopySource={"Bucket": storage.bucket, "Key": key},
        ChecksumAlgorithm="SHA256",
    )
    assert "ChecksumSHA256" not in answer["CopyObjectResult"], (
        "S3Proxy now answers a copy with its SHA-256, as S3 does: docs/benchmarks.md says it does not"
    )
    assert storage.copy_from(storage, "checkpoint/state/0/1/000008.sst", "copied/engine") == digest.hex()
    assert storage.read("copied/engine") == data

    bad = base64.b64encode(b"\0" * 32).decode()
    with pytest.raises(Exception, match="BadDigest"):
        storage.client.put_object(Bucket=storage.bucket, Key=storage._key("bad"), Body=data, ChecksumSHA256=bad)
    # an object written without a SHA-256 has none to carry: the engine copies it through its client instead
    storage.write("plain", data)
    assert storage.copy_from(storage, "plain", "copied/plain") is None


def test_ranged_reads(storage: S3Storage) -> None:
    pack = bytes(range(256)) * 64
    storage.write("packs/ab/pack", pack)
    assert storage.read_range("packs/ab/pack", 1000, 5000) == pack[1000:6000]
    assert storage.read_range("packs/ab/pack", len(pack) + 10, 100) == b""  # past the end: empty, not an error
    storage.write("empty", b"")
    assert storage.read("empty") == b""  # s3transfer's first ranged GET of an empty object answers InvalidRange


def test_multipart_upload_and_upload_part_copy(storage: S3Storage, tmp_path: Path) -> None:
    large = tmp_path / "large"
    large.write_bytes(hashlib.sha256(b"seed").digest() * (12 * MiB // 32))  # 12 MiB: three parts of 5 MiB
    storage.upload(large, "blobs/large")
    head = storage.client.head_object(Bucket=storage.bucket, Key=storage._key("blobs/large"))
    assert head["ETag"].strip('"').endswith("-3"), "uploaded in parts"
    storage.download("blobs/large", tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == large.read_bytes()

    # UploadPartCopy: how S3A renames a large file, and how S3 copies an object over 5 GB
    client, source = storage.client, {"Bucket": storage.bucket, "Key": storage._key("blobs/large")}
    key = storage._key("blobs/large-copy")
    upload = client.create_multipart_upload(Bucket=storage.bucket, Key=key)["UploadId"]
    parts = []
    for number, start in enumerate(range(0, 12 * MiB, 6 * MiB), 1):
        copied = client.upload_part_copy(
            Bucket=storage.bucket,
            Key=key,
            UploadId=upload,
            PartNumber=number,
            CopySource=source,
            CopySourceRange=f"bytes={start}-{start + 6 * MiB - 1}",
        )
        parts.append({"PartNumber": number, "ETag": copied["CopyPartResult"]["ETag"]})
    client.complete_multipart_upload(Bucket=storage.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts})
    assert storage.read("blobs/large-copy") == large.read_bytes()


def test_listings_with_a_delimiter_and_start_after(storage: S3Storage) -> None:
    for key in ("jobs/a/lease.json", "jobs/b/snapshots/1.json", "jobs/c/x", "_delta_log/00.json", "_delta_log/01.json"):
        storage.write(key, b"x")
    storage.write("jobs/d/", b"")  # a directory marker, as S3A writes them
    assert storage.children("jobs/") == ["a", "b", "c", "d"]
    assert [info.key for info in storage.list("_delta_log/", start_after="_delta_log/00.json")] == [
        "_delta_log/01.json"
    ]
    assert [info.key for info in storage.list("jobs/")] == ["jobs/a/lease.json", "jobs/b/snapshots/1.json", "jobs/c/x"]


def test_a_snapshot_of_a_checkpoint_written_with_checksums_copies_every_file_within_s3(
    s3_store: str,
    tmp_path: Path,
    calls: Counter[str],  # noqa: F811 (the imported fixture)
) -> None:
    """What S3A writes with the engine's conf: a HEAD tells each file's SHA-256, and one copy a content, on its
    source's ETag (CopySourceIfMatch), stores it. S3Proxy answers the copy without a checksum but honours the
    condition: one probe a create finds that out, and no copy is HEADed again."""
    store = SnapshotStore(open_storage(s3_store))
    store.blobs.init_format(PackSettings(threshold=0))  # every file its own object: each one a copy
    checkpoint, local = checkpoint_on_s3(s3_store, tmp_path, with_checksums=True)
    heads: list[str] = []
    client = store.storage.client  # type: ignore[attr-defined]

    def head(params: dict[str, Any], **_: Any) -> None:
        heads.append(params["Key"])

    client.meta.events.register("provide-client-params.s3.HeadObject", head)
    calls.clear()
    try:
        manifest = create_snapshot(store, checkpoint, SnapshotRequest(job="orders"))
    finally:
        client.meta.events.unregister("provide-client-params.s3.HeadObject", head)

    contents = len({entry.sha256 for entry in manifest.files})
    assert calls["CopyObject"] == contents + 1, "one copy a content, and the probe of CopySourceIfMatch"
    assert not [key for key in heads if f"/{BLOBS}" in key], "a copy made on its source's ETag was HEADed again"
    assert calls["GetObject"] <= 1 + 6 + 5 + 1, "no file content read"
    assert verify_snapshot(store, "orders", manifest.id).ok
    restored = tmp_path / "restored"
    execute_restore(store, plan_restore(store, "orders", manifest.id, open_storage(str(restored))))
    assert tree(restored) == {k: v for k, v in tree(local).items() if k in {e.path for e in manifest.files}}


def test_a_checkpoint_written_without_checksums_is_read_once_and_copied_within_s3(
    s3_store: str,
    tmp_path: Path,
    calls: Counter[str],  # noqa: F811 (the imported fixture)
) -> None:
    """S3 computes a copy's SHA-256; S3Proxy does not, and keeps no checksum of S3A's uploads (S3A sends it as an
    aws-chunked trailer, which S3Proxy drops). The first file is staged (once, whichever of the parallel copies
    comes first), found without a checksum, and from then on each file is read to hash it (ranged GETs pinned to
    its ETag) and copied within S3 by that ETag: its bytes come down once and none go up. The condition is probed
    once: S3Proxy honours it, so the copy holds the version that was hashed."""
    store = SnapshotStore(open_storage(s3_store))
    store.blobs.init_format(PackSettings(threshold=0))
    checkpoint, local = checkpoint_on_s3(s3_store, tmp_path, with_checksums=False)
    calls.clear()

    manifest = create_snapshot(store, checkpoint, SnapshotRequest(job="orders"))

    contents = len({entry.sha256 for entry in manifest.files})
    assert calls["CopyObject"] == 1 + contents + 1, "one staging copy, one copy a content, and the probe"
    assert calls["PutObject"] == 2 + 2 * 2 + 1 and calls["UploadPart"] == 0, "no content uploaded from here"
    assert calls["GetObject"] >= len(manifest.files), "each file read to hash it"
    assert not [info.key for info in store.storage.list(f"{BLOBS}staging/")], "staging objects left behind"
    assert verify_snapshot(store, "orders", manifest.id).ok
    restored = tmp_path / "restored"
    execute_restore(store, plan_restore(store, "orders", manifest.id, open_storage(str(restored))))
    assert tree(restored) == {k: v for k, v in tree(local).items() if k in {e.path for e in manifest.files}}


def test_a_file_replaced_between_its_hash_and_its_copy_is_caught(storage: S3Storage) -> None:
    """The ETag pins what was hashed to what is copied: a version replaced in between fails the copy (and the
    create starts again at a newer batch) instead of storing other bytes under the first one's checksum."""
    storage.write("state/0/0/9.changelog", b"first" * 1000)
    etag = storage.checksummed("state/0/0/9.changelog").etag
    sha, size = storage.hash_by_reading("state/0/0/9.changelog", etag, piece=1024)
    assert (sha, size) == (hashlib.sha256(b"first" * 1000).hexdigest(), 5000)
    storage.write("state/0/0/9.changelog", b"other" * 1000)
    with pytest.raises(Conflict):
        storage.copy_from(storage, "state/0/0/9.changelog", f"blobs/{sha}", if_match=etag)
    with pytest.raises(Conflict):
        storage.hash_by_reading("state/0/0/9.changelog", etag)
    assert storage.stat(f"blobs/{sha}") is None
