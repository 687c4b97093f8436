"""What a second snapshot of the same checkpoint reuses from the first instead of reading the checkpoint again:
the file lists of RocksDB zips it already held (no JVM; synthetic RocksDB stores with changelog checkpointing)."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

from airflow_plugin.core.snapshots.checkpoint import zip_listings
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import LocalStorage
from tests.support.synthetic import ROCKSDB, write_checkpoint

PARTITIONS = 2


class CountingStorage(LocalStorage):
    """A local checkpoint that counts whole-object reads by key."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[str] = []

    def read(self, key: str) -> bytes:
        self.reads.append(key)
        return super().read(key)

    def zip_reads(self) -> list[str]:
        reads, self.reads = sorted(k for k in self.reads if k.endswith(".zip")), []
        return reads


def rocksdb_zip(ssts: dict[str, int]) -> bytes:
    files = [
        {"localFileName": f"{i}.sst", "dfsSstFileName": n, "sizeBytes": s} for i, (n, s) in enumerate(ssts.items())
    ]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("metadata", "v1\n" + json.dumps({"sstFiles": files, "numKeys": 1}))
    return buffer.getvalue()


def add_zip(root: Path, partition: int, version: int, ssts: dict[str, int]) -> None:
    store = root / f"state/0/{partition}"
    (store / "SSTs").mkdir(exist_ok=True)
    for name, size in ssts.items():
        (store / "SSTs" / name).write_bytes(bytes([version]) * size)
    (store / f"{version}.zip").write_bytes(rocksdb_zip(ssts))


def commit(root: Path, batch: int) -> None:
    """Batch `batch` commits state version batch+1: a changelog in every store."""
    (root / f"offsets/{batch}").write_text(f'v1\n{{"batchWatermarkMs":0,"conf":{{}}}}\n{batch * 10}')
    for p in range(PARTITIONS):
        (root / f"state/0/{p}/{batch + 1}.changelog").write_bytes(f"changelog {batch} {p}".encode())
    (root / f"commits/{batch}").write_text('v1\n{"nextBatchWatermarkMs":0}')


def rocksdb_checkpoint(root: Path, batches: int) -> Path:
    write_checkpoint(root, batches=0, partitions=PARTITIONS, provider=ROCKSDB)
    for batch in range(batches):
        commit(root, batch)
    for p in range(PARTITIONS):
        add_zip(root, p, 2, {f"00000{p}-a.sst": 100, f"00000{p}-b.sst": 50})
    return root


def take(store: SnapshotStore, checkpoint: CountingStorage) -> set[str]:
    """Snapshot the checkpoint: the paths the snapshot holds."""
    return {entry.path for entry in create_snapshot(store, checkpoint, SnapshotRequest(job="orders")).files}


def test_a_second_snapshot_reads_only_the_zips_that_are_new(tmp_path: Path) -> None:
    root = rocksdb_checkpoint(tmp_path / "ckpt", batches=4)
    checkpoint = CountingStorage(root)
    store = SnapshotStore(LocalStorage(tmp_path / "store"))

    first = take(store, checkpoint)
    assert checkpoint.zip_reads()  # read for their file lists (and packed)
    assert {"state/0/0/2.zip", "state/0/0/SSTs/000000-a.sst", "state/0/1/SSTs/000001-b.sst"} <= first

    commit(root, 4)
    second = take(store, checkpoint)
    assert checkpoint.zip_reads() == []  # both zips are the ones the first snapshot held
    assert {"state/0/0/2.zip", "state/0/0/SSTs/000000-a.sst", "state/0/0/5.changelog"} <= second

    add_zip(root, 1, 5, {"000001-b.sst": 50, "000001-c.sst": 70})  # maintenance uploads a newer zip of store 1
    commit(root, 5)
    third = take(store, checkpoint)
    assert checkpoint.zip_reads() == ["state/0/1/5.zip", "state/0/1/5.zip"]  # its file list, then packed
    assert {"state/0/1/5.zip", "state/0/1/SSTs/000001-c.sst", "state/0/0/2.zip"} <= third
    assert "state/0/1/SSTs/000001-a.sst" not in third and "state/0/1/2.zip" not in third


def test_a_zip_replaced_under_the_same_name_is_read_again(tmp_path: Path) -> None:
    root = rocksdb_checkpoint(tmp_path / "ckpt", batches=4)
    checkpoint = CountingStorage(root)
    store = SnapshotStore(LocalStorage(tmp_path / "store"))
    take(store, checkpoint)
    checkpoint.zip_reads()

    add_zip(root, 0, 2, {"000000-a.sst": 100, "000000-z.sst": 800})  # another zip of version 2: a new size
    commit(root, 4)
    second = take(store, checkpoint)
    assert checkpoint.zip_reads() == ["state/0/0/2.zip", "state/0/0/2.zip"]
    assert "state/0/0/SSTs/000000-z.sst" in second and "state/0/0/SSTs/000000-b.sst" not in second


def test_zip_listings_take_each_stores_one_zip_and_the_files_beside_it() -> None:
    files = [
        ("state/0/0/2.zip", 10, 1.0),
        ("state/0/0/SSTs/1.sst", 100, 1.0),
        ("state/0/0/SSTs/1.sst.crc", 5, 1.0),  # a Spark 4.1 companion checksum, not listed by the zip
        ("state/0/0/logs/2.log", 7, 1.0),
        ("state/0/0/3.changelog", 3, 1.0),
        ("state/0/1/3.changelog", 3, 1.0),  # no zip: changelogs from version 1
        ("commits/4", 3, 1.0),
    ]
    assert zip_listings(files) == {("state/0/0/2.zip", 10, 1.0): [("SSTs/1.sst", 100), ("logs/2.log", 7)]}
