"""A snapshot's copy within S3 on a server that answers a copy without its checksum (SeaweedFS, S3Proxy): where the
server honours CopySourceIfMatch (probed once a create), a copy made on that condition holds the version whose
SHA-256 the source's HEAD told, and is not HEADed again; where it does not, each copy is HEADed, and a file
replaced between its HEAD and its copy is never stored under the first version's checksum. Against the embedded S3
(moto), its answers and conditions changed through boto3's own event hooks on the real client."""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from airflow_plugin.core.errors import CheckpointChanged
from airflow_plugin.core.layout import BLOBS, blob_key
from airflow_plugin.core.progress import NullProgress
from airflow_plugin.core.snapshots.blobs import PackSettings
from airflow_plugin.core.snapshots.create import SnapshotRequest, _Copier, _Known, create_snapshot
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.snapshots.verify import verify_snapshot
from airflow_plugin.core.storage import S3Settings, S3Storage, open_storage
from airflow_plugin.core.storage.s3 import COPY_CONCURRENCY
from tests.support.synthetic import write_checkpoint


class Server:
    """What the client sees of the server: copies answered without a checksum, CopySourceIfMatch honoured (refused
    here, 412, when the source's ETag is another) or ignored, and the keys of every HEAD and copy."""

    def __init__(self, storage: S3Storage, *, honours: bool) -> None:
        self.client, self.honours = storage.client, honours
        self.heads: list[str] = []
        self.copies: Counter[str] = Counter()
        self.before_copy: list[Any] = []

    def params(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name == "HeadObject":
            self.heads.append(params["Key"])
        if model.name == "CopyObject":
            self.copies["conditional" if "CopySourceIfMatch" in params else "plain"] += 1
            for action in self.before_copy:
                action(params)
            condition = params.pop("CopySourceIfMatch", None)  # moto ignores it: checked here where honoured
            if self.honours and condition is not None:
                source = params["CopySource"]
                if self.client.head_object(**source)["ETag"] != condition:
                    raise ClientError({"Error": {"Code": "PreconditionFailed"}}, "CopyObject")

    @staticmethod
    def without_checksum(parsed: dict[str, Any], **_: Any) -> None:
        parsed.get("CopyObjectResult", {}).pop("ChecksumSHA256", None)

    def __enter__(self) -> Server:
        self.client.meta.events.register("provide-client-params.s3", self.params)
        self.client.meta.events.register("after-call.s3.CopyObject", self.without_checksum)
        return self

    def __exit__(self, *_: object) -> None:
        self.client.meta.events.unregister("provide-client-params.s3", self.params)
        self.client.meta.events.unregister("after-call.s3.CopyObject", self.without_checksum)

    def blob_heads(self) -> int:
        """HEADs of the store's blobs: of the copies made (not of the checkpoint's files)."""
        return sum(1 for key in self.heads if f"/{BLOBS}" in key)


@pytest.fixture
def setup(s3_store: str, tmp_path: Path) -> Iterator[tuple[SnapshotStore, S3Storage]]:
    """A store that copies every file within S3, and a checkpoint on its S3 written with a SHA-256 per object."""
    bucket = open_storage(s3_store)
    assert isinstance(bucket, S3Storage)
    store = SnapshotStore(bucket)
    store.blobs.init_format(PackSettings(threshold=0))
    local = write_checkpoint(tmp_path / "local", batches=4, partitions=2)
    checkpoint = S3Storage(bucket.bucket, "checkpoints/orders", bucket.settings)
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        key = f"{checkpoint.prefix}/{path.relative_to(local)}"
        bucket.client.put_object(Bucket=bucket.bucket, Key=key, Body=path.read_bytes(), ChecksumAlgorithm="SHA256")
    yield store, checkpoint


@pytest.mark.parametrize("honours", [True, False], ids=["honoured", "ignored"])
def test_a_copy_on_an_honoured_condition_is_not_headed_again(
    setup: tuple[SnapshotStore, S3Storage], honours: bool
) -> None:
    store, checkpoint = setup
    with Server(store.storage, honours=honours) as server:  # type: ignore[arg-type]
        manifest = create_snapshot(store, checkpoint, SnapshotRequest(job="orders"))
    contents = len({entry.sha256 for entry in manifest.files})
    assert server.copies == {"conditional": contents + 1}  # every copy on its source's ETag; one probe
    assert server.blob_heads() == (0 if honours else contents)
    assert verify_snapshot(store, "orders", manifest.id).ok


@pytest.mark.parametrize("honours", [True, False], ids=["honoured", "ignored"])
def test_a_file_replaced_between_its_head_and_its_copy_is_never_stored_as_the_first_version(
    setup: tuple[SnapshotStore, S3Storage], honours: bool
) -> None:
    store, checkpoint = setup
    checkpoint.client.put_object(
        Bucket=checkpoint.bucket, Key=f"{checkpoint.prefix}/state/0/0/9.zip", Body=b"first" * 4000,
        ChecksumAlgorithm="SHA256",
    )  # fmt: skip
    info = next(i for i in checkpoint.list("state/") if i.key == "state/0/0/9.zip")
    copier = _Copier(checkpoint, _Known({}, {}), NullProgress(), store.blobs.writer())
    with Server(store.storage, honours=honours) as server:  # type: ignore[arg-type]
        # learn the server first (the probe, with another file), then replace the file just before its copy
        copier(next(i for i in checkpoint.list("state/") if i.key == "state/0/0/1.delta"))

        def replace(params: dict[str, Any]) -> None:
            if params["Key"].endswith(blob_key(hashlib.sha256(b"first" * 4000).hexdigest())):
                key = f"{checkpoint.prefix}/state/0/0/9.zip"
                checkpoint.client.put_object(Bucket=checkpoint.bucket, Key=key, Body=b"newer" * 4000)

        server.before_copy.append(replace)
        with pytest.raises(CheckpointChanged):
            copier(info)
    first = blob_key(hashlib.sha256(b"first" * 4000).hexdigest())
    assert store.storage.stat(first) is None, "the newer version stored under the first one's checksum"


def test_files_above_the_copy_threshold_are_copied_within_s3_and_smaller_ones_packed(
    setup: tuple[SnapshotStore, S3Storage], tmp_path: Path
) -> None:
    """A checkpoint on the store's S3 passes through the engine only its files up to `copy_threshold` (64 KiB),
    not every one up to the pack threshold (1 MiB); a checkpoint elsewhere packs up to the pack threshold."""
    store, checkpoint = setup
    store.blobs.init_format(PackSettings())
    sizes = {"state/0/0/1.delta": 100 * 1024, "state/0/1/1.delta": 10 * 1024}
    for key, size in sizes.items():
        checkpoint.client.put_object(
            Bucket=checkpoint.bucket, Key=f"{checkpoint.prefix}/{key}", Body=key.encode() * (size // len(key)),
            ChecksumAlgorithm="SHA256",
        )  # fmt: skip
    on_s3 = {e.path: e.key for e in create_snapshot(store, checkpoint, SnapshotRequest(job="orders")).files}
    assert on_s3["state/0/0/1.delta"].startswith(BLOBS) and "pack" not in on_s3["state/0/0/1.delta"]
    assert "pack" in on_s3["state/0/1/1.delta"]

    local = tmp_path / "local-copy"
    for info in checkpoint.list():
        (local / info.key).parent.mkdir(parents=True, exist_ok=True)
        (local / info.key).write_bytes(checkpoint.read(info.key))
    elsewhere = {
        e.path: e.key for e in create_snapshot(store, open_storage(str(local)), SnapshotRequest(job="x")).files
    }
    assert "pack" in elsewhere["state/0/0/1.delta"]


def test_copies_within_s3_run_more_at_once_than_transfers(setup: tuple[SnapshotStore, S3Storage]) -> None:
    """A copy within S3 costs the engine a request and no bytes: they run COPY_CONCURRENCY times the transfers'
    concurrency at once, up to the connection pool (each copy held on the server here for 50 ms)."""
    store, checkpoint = setup
    client = store.storage.client  # type: ignore[attr-defined]
    running, most = [0], [0]
    lock = threading.Lock()

    def begin(model: Any, **_: Any) -> None:
        if model.name == "CopyObject":
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.05)

    def end(model: Any, **_: Any) -> None:
        if model.name == "CopyObject":
            with lock:
                running[0] -= 1

    client.meta.events.register("before-call.s3", begin)
    client.meta.events.register("after-call.s3", end)
    try:
        manifest = create_snapshot(store, checkpoint, SnapshotRequest(job="orders"), concurrency=4)
    finally:
        client.meta.events.unregister("before-call.s3", begin)
        client.meta.events.unregister("after-call.s3", end)
    assert len(manifest.files) > 8 and most[0] > 4
    assert S3Storage("b", "", S3Settings(max_pool_connections=128)).copy_concurrency(16) == 16 * COPY_CONCURRENCY
    assert S3Storage("b", "", S3Settings(max_pool_connections=40)).copy_concurrency(16) == 24  # beside 16 transfers


def test_whether_a_file_is_copied_within_s3_resolves_no_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked for every file of a snapshot: equal settings are one client, so one endpoint; resolving the clients
    each time (12 environment lookups apiece) was a third of a 5 GB checkpoint's planning."""
    checkpoint, store = S3Storage("ckpt", "c", S3Settings()), S3Storage("store", "s", S3Settings())
    elsewhere = S3Storage("store", "s", S3Settings(endpoint_url="http://127.0.0.1:1"))

    def resolve(*_: Any) -> None:
        raise AssertionError("a client was resolved")

    monkeypatch.setattr("airflow_plugin.core.storage.s3._s3", resolve)
    assert store.copies_within(checkpoint, 1024) and not store.copies_within(elsewhere, 1024)
    assert not store.copies_within(checkpoint, 6 * 1024**3)  # over one CopyObject's 5 GB
