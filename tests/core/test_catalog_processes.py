"""The catalogs with real processes on S3 (the embedded moto server; children of a forkserver, so that a
process starts in milliseconds): processes creating, pinning, deleting and pruning one job at once (prunes
under the job's lease), straight and through the fault proxy; a create and a prune each killed with SIGKILL
right after every one of their writes (the proxy holds that write's answer back). Afterwards, readers see
exactly what the manifests hold, no entry was lost or brought back, and every COMPLETED snapshot verifies."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_plugin.core.records.manifest import SnapshotStatus
from airflow_plugin.core.retention.policy import KindPolicy, RetentionPolicy
from airflow_plugin.core.retention.prune import prune
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.snapshots.verify import verify_snapshot
from airflow_plugin.core.storage import open_storage
from devtools.embedded_s3 import EmbeddedS3
from devtools.faulty_s3 import FaultyS3
from devtools.forked import cli, spawn, wait_for
from tests.support.catalog_worker import work
from tests.support.catalogs import listed, truth
from tests.support.synthetic import add_batch, write_checkpoint

JOB = "orders"


@pytest.fixture(scope="module")
def proxy(s3_server: EmbeddedS3) -> Iterator[FaultyS3]:
    with FaultyS3(s3_server.endpoint, latency=0.02) as server:
        yield server


@pytest.fixture
def calm(proxy: FaultyS3) -> Iterator[FaultyS3]:
    proxy.calm()
    yield proxy
    proxy.calm()


def settled_and_whole(store: SnapshotStore) -> dict[str, tuple[str, bool, str | None]]:
    """What the manifests hold; checks that a reader sees exactly that (settling what killed writers left:
    their processes are gone), that no mark is left, and that every COMPLETED snapshot verifies."""
    records = truth(store, JOB)
    assert listed(store.list(JOB)) == records
    stored = store.catalog(JOB).stored()
    assert stored is not None and stored == ({i: v for i, (_, _, v) in records.items()}, []), stored
    for snapshot_id, (status, _, _) in records.items():
        if status == "COMPLETED":
            assert verify_snapshot(store, JOB, snapshot_id).ok, snapshot_id
    return records


@pytest.mark.parametrize("faults", [0.0, 0.1], ids=["straight", "10% faults"])
def test_processes_creating_pinning_deleting_and_pruning_at_once(
    calm: FaultyS3, s3_store: str, tmp_path: Path, faults: float
) -> None:
    checkpoint = write_checkpoint(tmp_path / "ckpt", batches=3)
    env = {**calm.env(), "AWS_MAX_ATTEMPTS": "20"}
    calm.set_rate(faults, seed=26)
    outs = [tmp_path / f"worker-{n}.json" for n in range(4)]
    workers = [spawn(work, s3_store, JOB, str(checkpoint), 100 + n, 8, str(out), env) for n, out in enumerate(outs)]
    for worker in workers:
        worker.join(300)
        assert worker.exitcode == 0
    calm.calm()
    done: list[dict[str, Any]] = [step for out in outs for step in json.loads(out.read_text())]
    created = {i for step in done if step["op"] == "create" and "ids" in step for i in step["ids"]}
    deleted = {i for step in done if step["op"] in ("delete", "prune") and "ids" in step for i in step["ids"]}
    uncertain = {i for step in done for i in step.get("uncertain", [])}
    assert created and deleted, done  # the race really had both sides
    assert faults == 0 or any("uncertain" in step for step in done) or calm.counts()["requests"] == 0

    records = settled_and_whole(SnapshotStore(open_storage(s3_store)))  # straight to the server
    assert not (deleted - uncertain) & set(records), "a deleted snapshot came back"
    assert created - deleted - uncertain <= set(records), "a snapshot nobody deleted is gone"


def _stalled_run(proxy: FaultyS3, args: list[str], write: int) -> bool:
    """Run `savepoints ARGS` through the proxy and kill it with SIGKILL right after its `write`-th write took
    effect; True if it was killed, False if it finished before making that many writes."""
    reached = proxy.stall_write(write)
    process = cli(args, {**proxy.env(), "AWS_MAX_ATTEMPTS": "3"})
    assert wait_for(lambda: reached.is_set() or not process.is_alive())
    killed = reached.is_set()
    if killed:
        process.kill()
    process.join(60)
    proxy.calm()
    assert process.exitcode == (-signal.SIGKILL if killed else 0), process.exitcode
    return killed


def test_a_create_killed_right_after_each_of_its_writes(calm: FaultyS3, s3_store: str, tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=3)
    store = SnapshotStore(open_storage(s3_store))
    create_snapshot(store, open_storage(str(ckpt)), SnapshotRequest(job=JOB))  # something to reuse
    args = ["create", JOB, "--store", s3_store, "--checkpoint", str(ckpt), "--concurrency", "2"]
    write = 0
    while True:
        write += 1
        add_batch(ckpt, 2 + write)  # each run has new files to store
        if not _stalled_run(calm, args, write):
            break
        settled_and_whole(store)
    # its writes: a pack, and the manifest twice (IN_PROGRESS, COMPLETED), each between a mark and a settle
    assert write - 1 >= 7, f"a create makes more writes than {write - 1}: were they all reached?"
    records = settled_and_whole(store)
    latest = store.latest(JOB)
    assert records[latest.id][0] == "COMPLETED" and latest.batch_id == 2 + write
    killed = [i for i, (status, _, _) in records.items() if status == SnapshotStatus.IN_PROGRESS]
    assert killed, "some kills should have left an IN_PROGRESS snapshot behind"


def test_a_prune_killed_right_after_each_of_its_writes(
    calm: FaultyS3, s3_server: EmbeddedS3, s3_store: str, tmp_path: Path
) -> None:
    """Each run starts from the same store (copied within S3): four snapshots of which the prune deletes three,
    repacks the pack the survivor shares with them, and deletes what is left unreferenced. A store-wide prune:
    it takes no lease (a killed one's lease would only make the next run wait for it)."""
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=1, partitions=3)
    bucket = s3_store.removeprefix("s3://").split("/", 1)[0]
    original = SnapshotStore(open_storage(f"s3://{bucket}/original"))
    for batch in range(1, 5):
        add_batch(ckpt, batch, partitions=3)
        create_snapshot(original, open_storage(str(ckpt)), SnapshotRequest(job=JOB))
    client = s3_server.client()
    keys = [info.key for info in original.storage.list()]
    policy = ["--savepoint-keep-last", "1", "--blob-grace", "0", "--max-unused", "0"]

    def fresh_copy(name: str) -> SnapshotStore:
        for key in keys:
            source = {"Bucket": bucket, "Key": f"original/{key}"}
            client.copy_object(Bucket=bucket, Key=f"{name}/{key}", CopySource=source)
        return SnapshotStore(open_storage(f"s3://{bucket}/{name}"))

    finishing = RetentionPolicy(savepoint=KindPolicy(keep_last=1), blob_grace_s=0.0, max_unused=0.0)
    write = 0
    while True:
        write += 1
        store = fresh_copy(f"run-{write}")
        if not _stalled_run(calm, ["prune", "--store", store.uri, *policy], write):
            break
        settled_and_whole(store)
        for _ in range(2):  # the next runs finish it: deletions, repacks, then the emptied packs
            prune(store, finishing)
        assert len(settled_and_whole(store)) == 1
        assert {i.key for p in ("packs/", "blobs/") for i in store.storage.list(p)} == set(store.list(JOB)[0].objects)
    assert write - 1 >= 8, f"a prune makes more writes than {write - 1}: were they all reached?"
