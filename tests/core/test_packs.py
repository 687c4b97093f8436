"""The blob layer (snapshots/blobs.py) on synthetic checkpoints: packing and its settings, large files as
single objects, coalesced reads, the refusal of formats it does not know, the incremental restore onto an
earlier restore (the upgrade's early restore) byte for byte against a plain one, and its refusals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from airflow_plugin.cli import main
from airflow_plugin.core.errors import IntegrityError, Refused
from airflow_plugin.core.layout import blob_key, manifest_key
from airflow_plugin.core.records.manifest import FileEntry, Kind, Manifest, SnapshotStatus, Trigger
from airflow_plugin.core.retention.policy import KindPolicy, RetentionPolicy
from airflow_plugin.core.retention.prune import prune
from airflow_plugin.core.snapshots.blobs import PackSettings, plan_reads
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.restore import execute_restore, plan_restore
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.snapshots.verify import verify_snapshot
from airflow_plugin.core.storage import LocalStorage, open_storage
from tests.support.synthetic import add_batch, tree, write_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def take(store: SnapshotStore, ckpt: Path) -> Manifest:
    return create_snapshot(store, LocalStorage(ckpt), SnapshotRequest(job="orders"), concurrency=4)


def restore(store: SnapshotStore, manifest: Manifest, target: Path, onto: str | None = None) -> dict:
    plan = plan_restore(store, "orders", manifest.id, LocalStorage(target), onto=onto)
    return execute_restore(store, plan, concurrency=4)


def test_small_files_share_packs_large_files_stay_single_objects(tmp_path: Path) -> None:
    store = SnapshotStore(LocalStorage(tmp_path / "store"))
    store.blobs.init_format(PackSettings(threshold=1000, target_size=300))
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=6, partitions=3)
    (ckpt / "state/0/0/7.snapshot").write_bytes(b"L" * 5000)  # over the threshold
    manifest = take(store, ckpt)
    packed = [f for f in manifest.files if f.key.startswith("packs/")]
    assert {f.key for f in manifest.files if f.size > 1000} == set()  # the snapshot file is not needed...
    assert len({f.key for f in packed}) > 3 and len(packed) == len(manifest.files)
    for entry in packed:  # each pack is the files back to back: a byte range IS the file
        stored = (tmp_path / "store" / entry.key).read_bytes()
        assert stored[entry.offset : entry.offset + entry.size] == (ckpt / entry.path).read_bytes()
    add_batch(ckpt, 6, partitions=3)
    (ckpt / "state/0/0/8.delta").write_bytes(b"L" * 5000)  # ... this large delta is
    second = take(store, ckpt)
    [large] = [f for f in second.files if f.size == 5000]
    assert (large.key, large.offset) == (blob_key(large.sha256), 0)
    assert (tmp_path / "store" / large.key).read_bytes() == b"L" * 5000
    assert verify_snapshot(store, "orders", second.id).ok
    restore(store, second, tmp_path / "r")
    assert tree(tmp_path / "r") == {f.path: (ckpt / f.path).read_bytes() for f in second.files}


def test_reads_are_coalesced_per_object() -> None:
    def entry(key: str, offset: int, size: int) -> FileEntry:
        return FileEntry(f"f{key}{offset}", size, "0" * 64, 0.0, key, offset)

    entries = [entry("packs/a", o, 10) for o in (0, 10, 30, 10_000_000)] + [entry("packs/b", 5, 1)]
    entries.append(entry("packs/a", 10, 10))  # the same content under another path: read once
    reads = plan_reads(entries, max_gap=100, max_read=1000)
    assert [(r.key, r.start, r.length, len(r.entries)) for r in reads] == [
        ("packs/a", 0, 40, 4),
        ("packs/a", 10_000_000, 10, 1),
        ("packs/b", 5, 1, 1),
    ]


def test_a_store_or_a_manifest_of_a_format_this_code_does_not_know_is_refused(tmp_path: Path) -> None:
    """The store's format.json and each manifest carry a format version; one this code does not know (an
    older one that was never released, or a newer savepoints') is refused, naming it and the fix."""
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=3)
    store = SnapshotStore(LocalStorage(tmp_path / "store"))
    taken = take(store, ckpt)
    assert json.loads(store.storage.read("format.json"))["format_version"] == 2
    for version in (1, 3):
        (tmp_path / "store" / "format.json").write_text(json.dumps({"format_version": version}))
        with pytest.raises(Refused, match=rf"store .* has format {version}; this savepoints knows format 2"):
            take(store, ckpt)
    (tmp_path / "store" / "format.json").write_text('{"format_version": 2}')
    key = f"jobs/orders/snapshots/{taken.id}/manifest.json"
    data = json.loads(store.storage.read(key))
    for version in (1, 3):
        store.storage.write(key, json.dumps({**data, "format_version": version}).encode())
        with pytest.raises(IntegrityError, match=rf"format_version {version}, which this savepoints does not know"):
            store.get("orders", taken.id)


# ---------------------------------------------------------------- incremental restore


@pytest.fixture
def two_snapshots(tmp_path: Path) -> tuple[SnapshotStore, Path, Manifest, Manifest]:
    """An early snapshot (batch 3) and a later one (batch 7, with offsets/8 pending) of one checkpoint."""
    store = SnapshotStore(LocalStorage(tmp_path / "store"))
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=4)
    early = take(store, ckpt)
    for batch in range(4, 8):
        add_batch(ckpt, batch)
    (ckpt / "metadata").write_text('{"id":"6f1c1a52-3f5e-4a7e-9a52-0f6f3b2c1d11","changed":true}')
    add_batch(ckpt, 8, commit=False)
    for old in ("offsets/0", "offsets/1", "commits/0"):  # Spark's cleanup
        (ckpt / old).unlink()
    return store, tmp_path, early, take(store, ckpt)


def test_incremental_restore_equals_a_plain_restore(two_snapshots: tuple) -> None:
    store, tmp_path, early, late = two_snapshots
    restore(store, early, tmp_path / "standby")
    result = restore(store, late, tmp_path / "standby", onto=early.id)
    restore(store, late, tmp_path / "plain")
    assert tree(tmp_path / "standby") == tree(tmp_path / "plain")
    assert result["onto"] == early.id and result["unchanged"] > 0 and result["removed"] > 0
    assert result["files"] < len(late.files)  # only what changed travelled
    assert {"metadata", "offsets/8", "commits/7"} <= set(plan_paths(store, late, tmp_path / "x", early))


def plan_paths(store: SnapshotStore, late: Manifest, target: Path, early: Manifest) -> list[str]:
    restore(store, early, target)
    return [f.path for f in plan_restore(store, "orders", late.id, LocalStorage(target), onto=early.id).files]


def test_incremental_restore_refuses_a_target_that_is_not_the_earlier_restore(two_snapshots: tuple) -> None:
    store, tmp_path, early, late = two_snapshots
    target = tmp_path / "standby"
    restore(store, early, target)
    (target / "commits/4").write_text("v1\n{}")  # a query ran there
    before = tree(target)
    with pytest.raises(Refused, match=r"not exactly the restore of snapshot .* e\.g\. commits/4"):
        restore(store, late, target, onto=early.id)
    assert tree(target) == before
    (target / "commits/4").unlink()
    later = tmp_path / "later"
    restore(store, late, later)
    with pytest.raises(Refused, match="it holds batch 7, later than the snapshot's 3"):
        restore(store, early, later, onto=late.id)
    other = json.loads(store.storage.read(f"jobs/orders/snapshots/{early.id}/manifest.json"))
    other["query_id"] = "another"
    store.storage.write(f"jobs/orders/snapshots/{early.id}/manifest.json", json.dumps(other).encode())
    with pytest.raises(Refused, match="of another query"):
        restore(store, late, target, onto=early.id)


def test_a_failed_incremental_restore_leaves_the_target_empty(two_snapshots: tuple) -> None:
    store, tmp_path, early, late = two_snapshots
    target = tmp_path / "standby"
    restore(store, early, target)
    victim = next(f for f in late.files if f.path == "commits/7")
    pack = tmp_path / "store" / victim.key
    stored = bytearray(pack.read_bytes())
    stored[victim.offset] ^= 0xFF
    pack.write_bytes(bytes(stored))
    with pytest.raises(IntegrityError, match="commits/7 does not match its checksum"):
        restore(store, late, target, onto=early.id)
    assert tree(target) == {}  # never half of each: a plain restore can follow


# ---------------------------------------------------------------- the runbook's restore without this project


def runbook_script(heading: str = "### Without savepoints installed") -> str:
    """The second bash block under the runbook's heading (the first sets the variables)."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text[text.index(heading) :]
    return section.split("```bash\n")[2].split("```")[0]


def test_the_runbooks_hand_restore_gives_what_restore_gives(tmp_path: Path, s3_store: str) -> None:
    store = SnapshotStore(open_storage(s3_store))
    store.blobs.init_format(PackSettings(threshold=2000, target_size=200))  # two packs and a blob
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=1, partitions=1)  # few files: the AWS CLI starts slowly
    (ckpt / "sources/0/1").write_bytes(b"")
    (ckpt / "state/0/0/1.delta").write_bytes(b"D" * 3000)
    manifest = create_snapshot(store, LocalStorage(ckpt), SnapshotRequest(job="orders"))
    assert {f.key[:6] for f in manifest.files} == {"packs/", "blobs/"} and any(f.size == 0 for f in manifest.files)
    assert len({f.key for f in manifest.files}) >= 3
    target = tmp_path / "by-hand"
    target.mkdir()
    env = {**os.environ, "STORE": s3_store, "JOB": "orders", "ID": manifest.id, "TARGET": str(target)}
    done = subprocess.run(["bash", "-c", runbook_script()], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "CORRUPT" not in done.stdout, done.stderr
    restore(store, manifest, tmp_path / "restored")
    assert tree(target) == tree(tmp_path / "restored") == {f.path: (ckpt / f.path).read_bytes() for f in manifest.files}


def test_a_prune_writes_each_manifest_once_however_many_of_its_packs_it_repacks(tmp_path: Path) -> None:
    """The packs of one prune are repacked together: a surviving manifest that points into several of them is
    re-pointed in one write (once a pack, a manifest was written as many times as the packs it used)."""
    store = SnapshotStore(LocalStorage(tmp_path / "store"))
    store.blobs.init_format(PackSettings(threshold=1000, target_size=300))  # many small packs
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=2, partitions=4)
    for batch in range(2, 8):
        add_batch(ckpt, batch, partitions=4)
        take(store, ckpt)
    writes: Counter[str] = Counter()
    replace = store.storage.replace

    def counted(key: str, data: bytes, token: str) -> str:
        writes[key] += 1
        return replace(key, data, token)

    store.storage.replace = counted  # type: ignore[method-assign]
    policy = RetentionPolicy(savepoint=KindPolicy(keep_last=2), blob_grace_s=0, max_unused=0.1)
    _, result = prune(store, policy)

    survivors = [store.get("orders", entry.id) for entry in store.list("orders")]
    assert result is not None and result.repacked >= 2 and len(survivors) == 2
    keys = {manifest_key("orders", m.id) for m in survivors}
    assert {key: count for key, count in writes.items() if key in keys} == dict.fromkeys(keys, 1)
    for survivor in survivors:
        assert verify_snapshot(store, "orders", survivor.id).ok
        target = tmp_path / f"restored-{survivor.id}"
        restore(store, survivor, target)
        assert tree(target) == {f.path: (ckpt / f.path).read_bytes() for f in survivor.files}


def test_a_repack_keeps_an_empty_file_and_the_content_at_its_offset_apart(tmp_path: Path) -> None:
    """An empty file takes no bytes of its pack, so it has the offset of the content appended after it: a repack
    that knew contents by offset alone moved one of the two and pointed both at it (the other file then failed
    its checksum, and its content went with the old pack)."""
    store = SnapshotStore(LocalStorage(tmp_path / "store"))
    store.blobs.init_format(PackSettings(threshold=100_000, target_size=10**7))
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=2, partitions=2)
    (ckpt / "sources/0/aaa_empty").write_bytes(b"")
    (ckpt / "sources/0/aab_data").write_bytes(b"X" * 50)
    for number in range(20):  # what makes the first pack mostly unused once they are gone
        (ckpt / f"sources/0/zz{number}").write_bytes(b"junk%d" % number * 200)
    first = create_snapshot(store, LocalStorage(ckpt), SnapshotRequest(job="orders"), concurrency=1)
    [empty, data] = [f for f in first.files if f.path in ("sources/0/aaa_empty", "sources/0/aab_data")]
    assert (empty.key, empty.offset) == (data.key, data.offset)  # the case: one offset, two contents
    # every content of the pack is this snapshot's: it uses all of it, the empty file's offset counted once
    stored = store.storage.stat(data.key)
    assert stored is not None and first.objects()[data.key] == stored.size
    for number in range(20):
        (ckpt / f"sources/0/zz{number}").unlink()
    add_batch(ckpt, 2, partitions=2)
    second = create_snapshot(store, LocalStorage(ckpt), SnapshotRequest(job="orders"), concurrency=1)

    _, result = prune(store, RetentionPolicy(savepoint=KindPolicy(keep_last=1), blob_grace_s=0, max_unused=0.1))

    assert result is not None and result.repacked == 1
    moved = store.get("orders", second.id)
    assert {f.path: f.key for f in moved.files}["sources/0/aab_data"] != data.key  # it was repacked
    assert verify_snapshot(store, "orders", second.id).ok
    restore(store, moved, tmp_path / "restored")
    assert (tmp_path / "restored/sources/0/aab_data").read_bytes() == b"X" * 50
    assert (tmp_path / "restored/sources/0/aaa_empty").read_bytes() == b""


def test_a_manifests_objects_count_an_empty_file_sharing_an_offset_as_nothing() -> None:
    """What a manifest uses of each object, whatever the order of its files: an empty file after the content at
    its offset used to replace that content's size with 0 (a pack looked more unused than it is)."""
    manifest = Manifest(
        "sp-1", "orders", Kind.SAVEPOINT, Trigger.MANUAL, SnapshotStatus.COMPLETED, "/ck", "now", batch_id=1
    )
    pack = "packs/ab/ab.pack"
    manifest.files = [
        FileEntry("a", 50, "1" * 64, key=pack, offset=0),
        FileEntry("b", 0, "2" * 64, key=pack, offset=50),
        FileEntry("c", 30, "3" * 64, key=pack, offset=50),
        FileEntry("d", 0, "2" * 64, key=pack, offset=0),
        FileEntry("e", 30, "3" * 64, key=pack, offset=50),  # the same content as c
    ]
    assert manifest.objects() == {pack: 80}


def test_a_repack_whose_new_pack_another_prune_collected_re_points_nothing(tmp_path: Path) -> None:
    """A repack's new packs are referenced by nothing until it re-points the manifests; a prune running beside it
    may collect them meanwhile (older than the grace period): then nothing is re-pointed and no marker written."""
    store = SnapshotStore(LocalStorage(tmp_path / "store"))
    store.blobs.init_format(PackSettings(threshold=1000, target_size=300))
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=2, partitions=4)
    for batch in range(2, 6):
        add_batch(ckpt, batch, partitions=4)
        take(store, ckpt)
    before = {entry.id: store.get("orders", entry.id).files for entry in store.list("orders")}
    write = store.storage.write

    def collected_at_once(key: str, data: bytes) -> None:  # the other prune, as soon as a new pack is written
        write(key, data)
        if key.startswith("packs/") and key.endswith(".pack"):
            store.storage.delete([key])

    store.storage.write = collected_at_once  # type: ignore[method-assign]
    policy = RetentionPolicy(savepoint=KindPolicy(keep_last=2), blob_grace_s=0, max_unused=0.1)
    _, result = prune(store, policy)

    assert result is not None and result.repacked == 0
    assert any("is gone (another prune collected it)" in note for note in result.notes)
    assert not [info.key for info in store.storage.list("packs/") if info.key.endswith(".retired")]
    for entry in store.list("orders"):
        assert store.get("orders", entry.id).files == before[entry.id]
        assert verify_snapshot(store, "orders", entry.id).ok


def test_repack_through_the_cli_keeps_every_snapshot_restorable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store_dir = tmp_path / "store"
    store = SnapshotStore(LocalStorage(store_dir))
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=2, partitions=4)
    made = []
    for batch in range(2, 6):
        add_batch(ckpt, batch, partitions=4)
        made.append(take(store, ckpt))
    expected = {f.path: (ckpt / f.path).read_bytes() for f in made[-1].files}
    old_packs = {f.key for m in made[:-1] for f in m.files}  # the packs the deleted snapshots wrote
    args = ["prune", "--store", str(store_dir), "--savepoint-keep-last", "1", "--blob-grace", "0", "--json"]

    assert main([*args, "--max-unused", "100%"]) == 0  # never repacks: the first pack stays, mostly unused
    first = json.loads(capsys.readouterr().out)
    assert first["result"]["deleted_snapshots"] == 3 and first["result"]["repacked_packs"] == 0
    assert old_packs <= {i.key for i in store.storage.list("packs/")}

    assert main([*args, "--max-unused", "10%"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["result"]["repacked_packs"] >= 1
    [listed] = store.list("orders")
    survivor = store.get("orders", listed.id)
    keys = {i.key for i in store.storage.list("packs/")}
    retired = {k.removesuffix(".retired") + ".pack" for k in keys if k.endswith(".retired")}
    assert retired and retired <= old_packs
    assert not retired & {f.key for f in survivor.files}  # its files were re-pointed to a new pack
    assert verify_snapshot(store, "orders", survivor.id).ok

    assert main([*args, "--max-unused", "10%"]) == 0  # the emptied packs go, with their markers
    third = json.loads(capsys.readouterr().out)
    assert third["result"]["deleted_blobs"] >= len(retired) and third["result"]["repacked_packs"] == 0
    left = {i.key for i in [*store.storage.list("packs/"), *store.storage.list("blobs/")]}
    assert left == {f.key for f in survivor.files}
    restore(store, survivor, tmp_path / "r")
    assert tree(tmp_path / "r") == expected


def test_verify_reports_a_truncated_pack_on_s3_and_a_missing_one(tmp_path: Path, s3_store: str) -> None:
    store = SnapshotStore(open_storage(s3_store))
    manifest = take(store, write_checkpoint(tmp_path / "ckpt", batches=3))
    [pack] = {f.key for f in manifest.files}
    store.storage.write(pack, store.storage.read(pack)[:10])  # cut short: ranges past the end read empty
    report = verify_snapshot(store, "orders", manifest.id)
    assert len(report.problems) == len([f for f in manifest.files if f.offset + f.size > 10])
    assert all("checksum mismatch" in p and pack in p for p in report.problems)
    store.storage.delete([pack])
    missing = verify_snapshot(store, "orders", manifest.id)
    assert len(missing.problems) == len(manifest.files) and "is missing" in missing.problems[0]


@pytest.mark.parametrize(
    ("kind", "number"),
    [("pack", 1), ("marker", 1), ("manifest", 1), ("manifest", 2)],
    ids=["after its first new pack", "at its first marker", "at its first manifest", "between two manifests"],
)
def test_a_repack_killed_at_each_step_leaves_every_snapshot_whole(tmp_path: Path, kind: str, number: int) -> None:
    """SIGKILL of the pruning process as it writes the Nth new pack, retired marker or re-pointed manifest: every
    snapshot still verifies and restores byte for byte, and the next prunes finish the job."""
    store = SnapshotStore(LocalStorage(tmp_path / "store"))
    store.blobs.init_format(PackSettings(threshold=1000, target_size=300))  # many packs: several to repack
    ckpt = write_checkpoint(tmp_path / "ckpt", batches=2, partitions=4)
    for batch in range(2, 8):
        add_batch(ckpt, batch, partitions=4)
        take(store, ckpt)
    policy = RetentionPolicy(savepoint=KindPolicy(keep_last=2), blob_grace_s=0, max_unused=0.1)
    survivors = [entry.id for entry in store.list("orders")][-2:]
    expected = {
        sid: {f.path: (ckpt / f.path).read_bytes() for f in store.get("orders", sid).files} for sid in survivors
    }

    child = os.fork()
    if child == 0:  # the pruning process: dies at the step, on its own hand
        seen: Counter[str] = Counter()
        write, replace = store.storage.write, store.storage.replace

        def step(key: str) -> None:
            kinds = {".retired": "marker", ".pack": "pack", "/manifest.json": "manifest"}  # not the catalogs
            what = next((name for suffix, name in kinds.items() if key.endswith(suffix)), "other")
            seen[what] += 1
            if what == kind and seen[what] == number:
                os.kill(os.getpid(), signal.SIGKILL)

        def writing(key: str, data: bytes) -> None:
            step(key)
            write(key, data)

        def replacing(key: str, data: bytes, token: str) -> str:
            step(key)
            return replace(key, data, token)

        store.storage.write = writing  # type: ignore[method-assign]
        store.storage.replace = replacing  # type: ignore[method-assign]
        try:
            prune(store, policy)
        finally:
            os._exit(3)  # the step was never reached
    _, status = os.waitpid(child, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status

    def whole() -> None:
        stored = {info.key for info in store.storage.list("packs/")}
        for entry in store.list("orders"):
            manifest = store.get("orders", entry.id)
            assert {f.key for f in manifest.files if f.size and f.key.startswith("packs/")} <= stored
            assert verify_snapshot(store, "orders", entry.id).ok
        for sid in survivors:
            target = tmp_path / f"restored-{sid}-{len(list(tmp_path.iterdir()))}"
            restore(store, store.get("orders", sid), target)
            assert tree(target) == expected[sid]

    whole()
    for _ in range(2):  # the next prune repacks again; the one after collects what the repack emptied
        _, result = prune(store, policy)
        assert result is not None
        whole()
    assert [entry.id for entry in store.list("orders")] == survivors
    keys = {i.key for i in store.storage.list("packs/") if i.key.endswith(".pack")}
    assert keys == {f.key for sid in survivors for f in store.get("orders", sid).files if f.key.startswith("packs/")}
